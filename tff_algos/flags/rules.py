"""Flag rules of the algorithms that need no TensorFlow.

The registry runs these before it imports an algorithm's module, so a bad
flag combination is answered at once; each algorithm's config still checks
its values (ranges, parsed weights) when it is built.
"""

from __future__ import annotations

from typing import Iterable

from tff_algos.flags.hparams import HParams

# Client optimisers that keep statistics (FedGBO, MFL, Mime(X)lite).
STATISTICS_OPTIMIZERS = ('sgdm', 'rmsprop', 'adam')
PAPER_LOCAL_STEPS = 10      # paper 004, Sec. 5: K = 10 (Table IV) or 50
PAPER_OPTIMIZER = 'sgdm'    # Table IV's client optimiser (beta 0.9: `gbo_optimizers.build`)

CLIENT_SGD = ('client_optimizer', 'client_momentum')
SERVER_STEP = ('server_optimizer', 'server_learning_rate', 'server_momentum',
               'server_lr_decay')

_DEFAULTS = HParams()


def _at_default(hp: HParams, flag: str) -> bool:
  value, default = getattr(hp, flag), getattr(_DEFAULTS, flag)
  return value == default or (default is None and not value)


def keep_defaults(name: str, hp: HParams, flags: Iterable[str], reason: str) -> None:
  """Refuses the flags of `flags` that `hp` sets: `name` does not read them."""
  bad = [f'--{flag}' for flag in flags if not _at_default(hp, flag)]
  if bad:
    them = 'them at their defaults' if len(bad) > 1 else 'it at its default'
    raise ValueError(f'{name} does not use {", ".join(bad)} ({reason}); leave {them}')


def fedsgd(hp: HParams) -> None:
  keep_defaults('fedsgd', hp, CLIENT_SGD + ('client_learning_rate', 'local_steps',
                                            'local_steps_decay', 'client_lr_decay'),
                'fedsgd clients send one gradient at the server model; the server '
                'optimizer takes the step')


# Algorithms whose clients still send a gradient at gamma = 0: the LocalUpdate
# family (paper 002: Theta's steps at gamma = 0 are minibatch SGD).
ZERO_CLIENT_STEP_OK = ('local_update', 'reptile', 'fomaml', 'kmaml', 'minibatch_sgd',
                       'local_update_decay')


def client_step(hp: HParams) -> None:
  """At least one local step (or epoch) a round."""
  if hp.local_steps is not None and hp.local_steps < 1:
    raise ValueError(f'--local_steps must be >= 1, got {hp.local_steps}')
  if hp.client_epochs_per_round < 1:
    raise ValueError(f'--client_epochs_per_round must be >= 1, got '
                     f'{hp.client_epochs_per_round}')


def warnings(name: str, hp: HParams) -> list[str]:
  """Legal settings that are most likely a mistake (the binaries print them):
  a client learning rate of 0 leaves the model where it started, except in the
  LocalUpdate family, and so does a server learning rate of 0 (but as the
  start of Nastya's adaptive step); a grid may still want them as a
  no-learning reference."""
  said = []
  if hp.client_learning_rate == 0 and name not in ZERO_CLIENT_STEP_OK + ('fedsgd',):
    said.append(f'--client_learning_rate=0: {name} clients do not move, so the model '
                'stays at its initial weights (gamma = 0 trains only in the LocalUpdate '
                'family, e.g. --algorithm=minibatch_sgd)')
  if hp.server_learning_rate == 0 and not hp.server_adaptive_lr:
    said.append(f'--server_learning_rate=0: the {name} server never moves the model, so '
                'it stays at its initial weights')
  return said


def client_schedule(hp: HParams) -> None:
  """K_t = ceil(K_0 d_K^t) needs a K_0."""
  if hp.local_steps is None and hp.local_steps_decay != 1.0:
    raise ValueError('local_steps_decay needs local_steps (K_0): set --local_steps or '
                     'leave --local_steps_decay at 1')


def statistics_optimizer(hp: HParams, what: str) -> None:
  """--client_optimizer=sgdm|rmsprop|adam and the statistics flags it reads."""
  if hp.client_optimizer not in STATISTICS_OPTIMIZERS:
    raise ValueError(f'{what} needs --client_optimizer in {STATISTICS_OPTIMIZERS} '
                     f'(an optimiser with statistics), got {hp.client_optimizer!r}')
  if hp.client_optimizer == 'sgdm' and hp.client_beta_1 is not None:
    raise ValueError('SGDm: set beta with --client_momentum, not --client_beta_1')
  if hp.client_optimizer != 'sgdm' and hp.client_momentum is not None:
    raise ValueError(f'--client_momentum is for sgdm; {hp.client_optimizer} '
                     'takes --client_beta_1/--client_beta_2')


def server_averages(name: str, hp: HParams) -> None:
  keep_defaults(name, hp, SERVER_STEP,
                'the server averages the client models, no server optimizer')


def paper_defaults(unset: frozenset[str]) -> dict:
  """Paper 004's K and client optimiser for the flags left unset (FedGBO, MFL,
  Mimelite, MimeXlite): the trainer's plain SGD has no statistics to keep."""
  defaults = {}
  if 'client_optimizer' in unset:
    defaults['client_optimizer'] = PAPER_OPTIMIZER
  if {'local_steps', 'client_epochs_per_round'} <= unset:
    defaults['local_steps'] = PAPER_LOCAL_STEPS
  return defaults


def fedgbo(hp: HParams) -> None:
  server_averages('fedgbo', hp)
  if hp.local_steps is None:
    raise ValueError('fedgbo needs --local_steps (K): its inverse step divides by K')
  statistics_optimizer(hp, 'fedgbo')


def mfl(hp: HParams) -> None:
  server_averages('mfl', hp)
  if hp.client_optimizer not in STATISTICS_OPTIMIZERS:
    raise ValueError(f'MFL averages client optimiser state: --client_optimizer must be '
                     f'one of {STATISTICS_OPTIMIZERS}, got {hp.client_optimizer!r}')
  statistics_optimizer(hp, 'mfl')
  client_schedule(hp)


def fednova(hp: HParams) -> None:
  keep_defaults('fednova', hp, CLIENT_SGD + ('server_optimizer', 'server_momentum',
                                             'uniform_weighting'),
                'fednova runs plain SGD on clients and server, clients weighted by n_i')
  client_schedule(hp)


def mime(name: str):
  def check(hp: HParams) -> None:
    keep_defaults(name, hp, ('server_lr_decay',), f'{name} has no server decay')
    statistics_optimizer(hp, name)
    client_schedule(hp)
  return check


# Algorithms whose server means weight the clients equally by construction:
# --uniform_weighting changes nothing for them (refused by the trainer, dropped
# with a note in grids).
EQUAL_WEIGHTED = ('feddyn', 'scaffold')


def feddyn(hp: HParams) -> None:
  keep_defaults('feddyn', hp, CLIENT_SGD, 'feddyn clients run plain SGD')
  keep_defaults('feddyn', hp, ('uniform_weighting',),
                'its server rule averages the active clients with equal weights, '
                'theta = mean theta_k - h/alpha, as paper 003')
  keep_defaults('feddyn', hp, ('server_optimizer', 'server_learning_rate', 'server_lr_decay'),
                'feddyn has its own server rule, theta = mean theta_k - h/alpha')
  client_schedule(hp)


def scaffold(hp: HParams) -> None:
  keep_defaults('scaffold', hp, CLIENT_SGD, 'scaffold clients run plain SGD')
  keep_defaults('scaffold', hp, ('uniform_weighting',),
                'its server step averages the sampled clients with equal weights, '
                'x += eta_g mean dy, as Karimireddy et al. and paper 003')
  keep_defaults('scaffold', hp, ('server_optimizer', 'server_momentum', 'server_lr_decay'),
                'scaffold takes a plain global step eta_g = --server_learning_rate')
  client_schedule(hp)


def nastya(name: str):
  def check(hp: HParams) -> None:
    keep_defaults(name, hp, CLIENT_SGD, 'nastya/fedrr clients run plain SGD at gamma')
    keep_defaults(name, hp, ('local_steps', 'local_steps_decay', 'client_epochs_per_round'),
                  'nastya/fedrr take exactly one pass over the local data per round')
    if name == 'fedrr':
      keep_defaults(name, hp, SERVER_STEP + ('server_adaptive_lr',),
                    'fedrr has no server step of its own (eta_i = gamma n_i); use '
                    '--algorithm=nastya for a server step size or optimizer')
    milestones(hp)
  return check


def milestones(hp: HParams) -> tuple[int, ...]:
  try:
    return tuple(int(m) for m in hp.client_lr_milestones or ())
  except ValueError:
    raise ValueError('--client_lr_milestones takes round numbers, e.g. 150,200') from None


def local_update(name: str):
  def check(hp: HParams) -> None:
    keep_defaults(name, hp, CLIENT_SGD + ('local_steps_decay', 'client_lr_decay',
                                          'server_lr_decay'),
                  'LocalUpdate runs client SGD at gamma; use --server_optimizer / the '
                  'decay_* flags')
  return check
