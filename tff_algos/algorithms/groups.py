"""The hyperparameter groups that algorithms share, declared once.

An algorithm's config is a frozen dataclass deriving from the groups it reads
(`core.hparams`): FedDyn's clients run plain SGD (`ClientSGD`) for K steps or E
epochs (`LocalWork`, `ClientDecay`); FedAvg's take any client and server
optimiser (`ClientOptimizer`, `ServerOptimizer`). A group's fields are its
flags, of the same names (google-research/federated's where they exist).
No TensorFlow here: the builders make the optimisers and schedules from the
values (`client_optimizer_spec().build()`, `client_schedule()`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.core import optimizers
from tff_algos.core.hparams import (DECAY, Config, at_least, above, field_flags, hparam,
                                    refuse)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientSGD(Config):
  """Clients step with plain SGD at gamma_t."""
  client_learning_rate: float = hparam(0.1, 'Client learning rate gamma_0.',
                                       valid=at_least(0))

  def advice(self) -> list[str]:
    """Legal settings that are most likely a mistake (the binaries print them)."""
    if self.client_learning_rate == 0 and not self.MOVES_AT_ZERO_CLIENT_RATE:
      return ['{client_learning_rate}=0: {algorithm} clients do not move, so the model stays '
              'at its initial weights (gamma = 0 trains only in the LocalUpdate family, '
              'e.g. --algorithm=minibatch_sgd)']
    return []

  # Whether clients still send something that trains at gamma = 0 (the
  # LocalUpdate family: Theta's weighted gradients at x_t are minibatch SGD).
  MOVES_AT_ZERO_CLIENT_RATE = False


def optimizer_spec(config, side: str, check_unused: bool = True) -> optimizers.OptimizerSpec:
  """The `side` ('client' or 'server') optimiser of `config`'s fields, refused
  (`ConfigError` naming the fields) where a hyperparameter is out of its range
  or one its optimiser lacks is set (--server_momentum with sgd was dropped)."""
  values = {n: getattr(config, f'{side}_{n}', None) for n in optimizers.HYPERPARAMETERS}
  name = getattr(config, f'{side}_optimizer')
  try:
    spec = optimizers.OptimizerSpec(name, getattr(config, f'{side}_learning_rate'), **values)
  except optimizers.HyperparameterError as e:
    of = '' if e.field == 'learning_rate' else f' with {{{side}_optimizer}}={e.optimizer}'
    raise refuse('{%s_%s} must be %s%s, got {value}' % (side, e.field, e.rule, of),
                 value=e.value) from None
  unused = spec.unused()
  if unused and check_unused:
    has = ', '.join('{%s_%s}' % (side, f) for f in optimizers.hyperparameters(name))
    them = 'it' if len(unused) == 1 else 'them'
    raise refuse(
        ', '.join('{%s_%s}' % (side, f) for f in unused)
        + f' {"is" if len(unused) == 1 else "are"} not used by {{{side}_optimizer}}={name} '
        f'(it takes {has or "only the learning rate"}); leave {them} unset'
        + (f' or use {{{side}_optimizer}}=sgdm' if name == 'sgd' and 'momentum' in unused
           else ''))
  return spec


def optimizer_fields(side: str, spec: optimizers.OptimizerSpec) -> dict:
  """The `side`_* fields that say the optimiser `spec` (`optimizer_spec`'s inverse):
  `FedOptConfig(**optimizer_fields('server', OptimizerSpec('adam', 0.01)))`."""
  fields = {f'{side}_optimizer': spec.name, f'{side}_learning_rate': spec.learning_rate}
  for name in optimizers.HYPERPARAMETERS:
    if getattr(spec, name) is not None:
      fields[f'{side}_{name}'] = getattr(spec, name)
  return fields


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientOptimizer(ClientSGD):
  """Clients step with any `tff.learning.optimizers` optimiser (`core.optimizers`)."""
  client_optimizer: str = hparam('sgd', 'Client optimizer.', choices=optimizers.NAMES)
  client_momentum: Optional[float] = hparam(None, 'Client momentum (sgdm).')
  client_beta_1: Optional[float] = hparam(None, 'Client beta_1 (adam; fedgbo/mime/mfl).')
  client_beta_2: Optional[float] = hparam(None, 'Client beta_2 (adam; rmsprop decay).')
  client_epsilon: Optional[float] = hparam(None, 'Client epsilon (adam, rmsprop).')

  def check(self):
    self.client_optimizer_spec()

  def client_optimizer_spec(self) -> optimizers.OptimizerSpec:
    return optimizer_spec(self, 'client')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientDecay(Config):
  """gamma_t = gamma_0 d_gamma^t."""
  client_lr_decay: float = hparam(1.0, 'd_gamma: gamma_t = gamma_0 d_gamma^t.', valid=DECAY)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalWork(Config):
  """K_t = ceil(K_0 d_K^t) local steps per round, or E epochs when K_0 is unset."""
  local_steps: Optional[int] = hparam(None, 'Local steps K_0 per round (overrides epochs).',
                                      valid=at_least(1), yields_to='client_epochs_per_round')
  client_epochs_per_round: int = hparam(1, 'Local epochs E per round (used when '
                                           '--local_steps is unset).', valid=at_least(1))
  local_steps_decay: float = hparam(1.0, 'd_K: K_t = ceil(K_0 d_K^t).', valid=DECAY)

  def check(self):
    if self.local_steps is None and self.local_steps_decay != 1.0:
      raise refuse('local_steps_decay needs local_steps (K_0): set {local_steps} or leave '
                   '{local_steps_decay} at 1')
    if self.local_steps is not None and self.client_epochs_per_round != 1:
      raise refuse('{local_steps} (K) and {client_epochs_per_round} both set: K steps '
                   'replace the epochs, which would be ignored; leave '
                   '{client_epochs_per_round} unset, or {local_steps} for epochs')


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalSchedule(ClientSGD, LocalWork, ClientDecay):
  """The client schedule of paper 000: gamma_t = gamma_0 d_gamma^t and K_t
  steps (or E epochs) per round."""

  def client_schedule(self, server_lr=None):
    """The schedule the client work runs (`core.client_work.ClientSchedule`;
    TensorFlow: for the builders). `server_lr`: eta_t, where it decays."""
    from tff_algos.core import client_work  # pylint: disable=g-import-not-at-top
    return client_work.client_schedule(
        self.client_learning_rate, self.client_lr_decay, self.local_steps,
        self.local_steps_decay, self.client_epochs_per_round, server_lr=server_lr)

  def shared_schedule_key(self):
    """This config with the schedule's numbers (gamma_0, d_gamma, K_0, d_K,
    which the computations read from the state) at fixed values: configs with
    equal keys run on one build (`registry.BuildCache`)."""
    return dataclasses.replace(
        self, client_learning_rate=1.0, client_lr_decay=1.0,
        local_steps=None if self.local_steps is None else 1, local_steps_decay=1.0)

  def schedule_values(self):
    return self.client_schedule().state_values()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerRate(Config):
  """The server steps at eta_t."""
  server_learning_rate: float = hparam(1.0, 'Server learning rate eta_0.', valid=at_least(0))

  def advice(self) -> list[str]:
    if self.server_learning_rate == 0 and not self.server_rate_adapts():
      return ['{server_learning_rate}=0: the {algorithm} server never moves the model, so '
              'it stays at its initial weights']
    return []

  def server_rate_adapts(self) -> bool:
    """Whether eta_0 only starts an adaptive step (Nastya's): then 0 is no mistake."""
    return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerOptimizer(ServerRate):
  """The server applies the clients' mean update with any optimiser."""
  server_optimizer: str = hparam('sgd', 'Server optimizer.', choices=optimizers.NAMES)
  server_momentum: Optional[float] = hparam(None, 'Server momentum (sgdm).')
  server_beta_1: Optional[float] = hparam(None, 'Server beta_1 (adam, yogi).')
  server_beta_2: Optional[float] = hparam(None, 'Server beta_2 (adam, yogi; rmsprop decay).')
  server_epsilon: Optional[float] = hparam(None, 'Server epsilon (adaptive optimizers).')
  server_initial_accumulator: Optional[float] = hparam(
      None, 'Initial second-moment accumulator (yogi, adagrad).')

  def check(self):
    self.server_optimizer_spec()

  def server_optimizer_spec(self) -> optimizers.OptimizerSpec:
    return optimizer_spec(self, 'server')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerDecay(Config):
  """eta_t = eta_0 d_eta^t."""
  server_lr_decay: float = hparam(1.0, 'd_eta: eta_t = eta_0 d_eta^t.', valid=DECAY)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Weighting(Config):
  """Clients weighted by their examples n_i, or equally."""
  uniform_weighting: bool = hparam(False, "Weight clients equally, 1/M (TFF's "
                                          'ClientWeighting.UNIFORM), not by examples n_i '
                                          '(NUM_EXAMPLES).')


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalRegularization(Config):
  """Paper 003's reference code: the local gradient clipped to a global norm,
  then weight decay added (`step_transforms.clip_then_decay`)."""
  client_weight_decay: float = hparam(0.0, 'l2 weight decay of local steps, added to the '
                                           '(clipped) gradient: plain L2, also with an Adam '
                                           'client (paper 003 reference code: 1e-3).',
                                      valid=at_least(0))
  clip_norm: Optional[float] = hparam(None, 'Global-norm clipping of local gradients, before '
                                            'the weight decay (paper 003 reference code: 10). '
                                            'Unset: off.', valid=above(0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceAverage(Config):
  """Paper 003 evaluates the average of all device models (`core.device_average`)."""
  report_device_average: bool = hparam(False, 'Evaluate the average of all device models, as '
                                              'paper 003 does (one more upload).')


def own_flags(group: type, base: type) -> tuple[str, ...]:
  """The flags that `group` declares beyond those of its `base`."""
  inherited = field_flags(base).values()
  return tuple(f for f in field_flags(group).values() if f not in inherited)


# The reasons the binaries give where an algorithm has no field for a group's
# flags (`Config.WHY_NOT`), for the algorithms that say them alike.
CLIENT_OPTIMIZER_FLAGS = own_flags(ClientOptimizer, ClientSGD)
SERVER_OPTIMIZER_FLAGS = own_flags(ServerOptimizer, ServerRate)
# Every flag of the server's step: of an algorithm that has none of its own.
SERVER_STEP_FLAGS = (*field_flags(ServerOptimizer).values(), *field_flags(ServerDecay).values())


def why_not(reasons: dict[tuple[str, ...], str]) -> dict[str, str]:
  """{(flags...): reason} as {flag: reason}, for `WHY_NOT`."""
  return {flag: reason for flags, reason in reasons.items() for flag in flags}


# Of an algorithm whose clients step with plain SGD (`ClientSGD` alone).
PLAIN_SGD_CLIENTS = why_not({CLIENT_OPTIMIZER_FLAGS: '{algorithm} clients run plain SGD'})
