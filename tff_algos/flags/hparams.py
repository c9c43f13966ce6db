"""Algorithm-facing hyperparameters: the one source of the trainer's algorithm flags.

Every algorithm builder reads what it needs from one `HParams`. Each field is
a flag of the trainer of the same name, default and help (`experiments/lib/flags.py`
defines them from these fields): add a field with `_flag(default, help)` when an
algorithm needs a new knob. This module imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_algos.core import optimizers


def _flag(default, help_text: str, choices: Optional[Sequence[str]] = None):
  """A field that is also a trainer flag (`experiments.lib.flags` defines it)."""
  return dataclasses.field(default=default, metadata={'help': help_text, 'choices': choices})


@dataclasses.dataclass(frozen=True)
class HParams:
  """Algorithm-facing hyperparameters (flag names of the trainer)."""
  client_optimizer: str = _flag('sgd', 'Client optimizer.', choices=optimizers.NAMES)
  client_learning_rate: float = _flag(0.1, 'Client learning rate gamma_0.')
  client_momentum: Optional[float] = _flag(None, 'Client momentum (sgdm).')
  server_optimizer: str = _flag('sgd', 'Server optimizer.', choices=optimizers.NAMES)
  server_learning_rate: float = _flag(1.0, 'Server learning rate eta_0.')
  server_momentum: Optional[float] = _flag(None, 'Server momentum (sgdm).')
  server_beta_1: Optional[float] = _flag(None, 'Server beta_1 (adam, yogi).')
  server_beta_2: Optional[float] = _flag(None, 'Server beta_2 (adam, yogi; rmsprop decay).')
  server_epsilon: Optional[float] = _flag(None, 'Server epsilon (adaptive optimizers).')
  server_initial_accumulator: Optional[float] = _flag(None, 'Initial second-moment '
                                                            'accumulator (yogi, adagrad).')
  client_epochs_per_round: int = _flag(1, 'Local epochs E per round (used when --local_steps '
                                          'is unset).')
  local_steps: Optional[int] = _flag(None, 'Local steps K_0 per round (overrides epochs).')
  local_steps_decay: float = _flag(1.0, 'd_K: K_t = ceil(K_0 d_K^t).')
  client_lr_decay: float = _flag(1.0, 'd_gamma: gamma_t = gamma_0 d_gamma^t.')
  client_lr_milestones: Optional[Sequence] = _flag(None, 'nastya/fedrr: gamma divided by 10 '
                                                         'at each of these rounds (PyTorch '
                                                         'MultiStepLR; paper 001: 150,200).')
  server_lr_decay: float = _flag(1.0, 'd_eta: eta_t = eta_0 d_eta^t.')
  uniform_weighting: bool = _flag(False, "Weight clients equally, 1/M (TFF's "
                                         'ClientWeighting.UNIFORM), not by examples n_i '
                                         '(NUM_EXAMPLES). FedDyn and SCAFFOLD weight '
                                         'equally already (refused for them).')
  token_weighting: bool = _flag(False, 'fedavg: weight clients by their non-padding target '
                                       "tokens (Reddi et al.'s code for Shakespeare and "
                                       'StackOverflow NWP), not by examples n_i.')
  # LocalUpdate / LocalUpdateDecay (paper 002).
  theta: str = _flag('reptile', 'LocalUpdate step weights: reptile, fomaml, kmaml, '
                                'minibatch_sgd (K = --local_steps, default 10) or numbers '
                                '"1,0,0.5".')
  decay_min_delta: float = _flag(1e-4, 'LocalUpdateDecay: improvement threshold Delta.')
  client_lr_decay_factor: float = _flag(0.1, 'LocalUpdateDecay: gamma <- alpha gamma.')
  server_lr_decay_factor: float = _flag(0.9, 'LocalUpdateDecay: eta <- beta eta.')
  decay_patience: int = _flag(100, 'LocalUpdateDecay: patience P (rounds).')
  decay_window: int = _flag(100, 'LocalUpdateDecay: moving-average window W.')
  decay_cooldown: int = _flag(100, 'LocalUpdateDecay: cooldown C (also at start).')
  decay_reference_semantics: bool = _flag(False, "LocalUpdateDecay: the reference code's "
                                                 "rule (Keras's best, moved only by "
                                                 'improvements > Delta; window starts at '
                                                 'inf; example-weighted means unless '
                                                 '--uniform_weighting) instead of the '
                                                 "paper's eq. 25 (running minimum).")
  # Nastya (paper 001).
  server_adaptive_lr: bool = _flag(False, 'Nastya: adaptive server step of Malitsky & '
                                          'Mishchenko (2020), starting from '
                                          '--server_learning_rate.')
  # Client optimiser statistics (adam, rmsprop; FedGBO, MFL, Mimelite, paper 004).
  client_beta_1: Optional[float] = _flag(None, 'Client beta_1 (adam; fedgbo/mime/mfl).')
  client_beta_2: Optional[float] = _flag(None, 'Client beta_2 (adam; rmsprop decay).')
  client_epsilon: Optional[float] = _flag(None, 'Client epsilon (adam, rmsprop).')
  # FedGBO/Mime(X)lite: the authors' code (v_0 = 1, no bias correction, eps 1e-3, plain mean).
  gbo_reference_conventions: bool = _flag(False, 'FedGBO/MFL/Mimelite/MimeXlite: the '
                                                 "reference code's conventions (v_0 = 1, no "
                                                 'bias correction, eps = 1e-3, unweighted '
                                                 'client mean).')
  # FedDyn / SCAFFOLD / FedProx (paper 003).
  feddyn_alpha: float = _flag(0.01, 'FedDyn: dynamic regulariser alpha.')
  feddyn_adaptive_alpha: bool = _flag(False, 'FedDyn: alpha_k = alpha / (n_k / mean n) '
                                             '(reference code).')
  feddyn_weight_decay_form: bool = _flag(False, 'FedDyn: the alpha quadratic as SGD weight '
                                                'decay, outside gradient clipping (reference '
                                                'code).')
  # SCAFFOLD as paper 003's code: c / w_i, dc weighted by w_i = n_i / mean n, c_i+ over gamma_0.
  scaffold_reference_conventions: bool = _flag(False, "SCAFFOLD as paper 003's code: c "
                                                      'scaled by mean n / n_i in the local '
                                                      'step and n_i / mean n in the server '
                                                      'sum; c_i+ divides by the initial '
                                                      'learning rate.')
  # Evaluate the average of all device models (paper 003; feddyn, scaffold, fedavg, fedprox).
  report_device_average: bool = _flag(False, 'Evaluate the average of all device models, as '
                                             'paper 003 does (feddyn, scaffold: plain mean; '
                                             'fedavg, fedprox: weighted as the server '
                                             'weights clients); one more upload.')
  # Local steps (feddyn, scaffold, fedavg, fedprox, fedmax): grad clipped, then + decay.
  client_weight_decay: float = _flag(0.0, 'l2 weight decay of local steps, added to the '
                                          '(clipped) gradient: plain L2, also with an Adam '
                                          'client (feddyn, scaffold, fedavg, fedprox, '
                                          'fedmax; paper 003 reference code: 1e-3).')
  clip_norm: Optional[float] = _flag(None, 'Global-norm clipping of local gradients, before '
                                           'the weight decay (feddyn, scaffold, fedavg, '
                                           'fedprox, fedmax; paper 003 reference code: 10). '
                                           'Unset: off.')
  prox_mu: float = _flag(0.01, 'FedProx proximal strength mu.')
  # FedMAX (paper 004 baseline).
  fedmax_beta: float = _flag(1.0, 'FedMAX: weight beta of KL(softmax(penultimate '
                                  'activations) || uniform) in the local loss.')
  fedmax_reference_kl: bool = _flag(False, 'FedMAX: KL(uniform || softmax(.)), the direction '
                                           "of the authors' code.")

  def client_optimizer_spec(self, check_unused: bool = True) -> optimizers.OptimizerSpec:
    """The client optimiser; `check_unused`: refuse a hyperparameter it lacks."""
    with _flag_named('client'):
      spec = optimizers.OptimizerSpec(
          self.client_optimizer, self.client_learning_rate, momentum=self.client_momentum,
          beta_1=self.client_beta_1, beta_2=self.client_beta_2, epsilon=self.client_epsilon)
    return _used('client', spec) if check_unused else spec

  def server_optimizer_spec(self, check_unused: bool = True) -> optimizers.OptimizerSpec:
    """The server optimiser; `check_unused`: refuse a hyperparameter it lacks."""
    with _flag_named('server'):
      spec = optimizers.OptimizerSpec(
          self.server_optimizer, self.server_learning_rate,
          momentum=self.server_momentum, beta_1=self.server_beta_1,
          beta_2=self.server_beta_2, epsilon=self.server_epsilon,
          initial_accumulator=self.server_initial_accumulator)
    return _used('server', spec) if check_unused else spec

  def check_ranges(self) -> None:
    """Refuses (ValueError naming the flag) a schedule or LocalUpdateDecay
    setting out of range, before TensorFlow: the schedules refused them later,
    as 'decay must be in (0, 1]' without saying which."""
    for name in ('client_learning_rate', 'server_learning_rate'):
      if not 0 <= getattr(self, name) < math.inf:
        raise ValueError(f'--{name} must be a finite number >= 0, got {getattr(self, name)}')
    for name in ('local_steps_decay', 'client_lr_decay', 'server_lr_decay',
                 'client_lr_decay_factor', 'server_lr_decay_factor'):
      value = getattr(self, name)
      if not 0 < value <= 1:
        raise ValueError(f'--{name} must be in (0, 1] (1: no decay), got {value}')
    for name, low in (('decay_window', 1), ('decay_patience', 0), ('decay_cooldown', 0)):
      if getattr(self, name) < low:
        raise ValueError(f'--{name} must be >= {low}, got {getattr(self, name)}')
    if not self.decay_min_delta >= 0:
      raise ValueError(f'--decay_min_delta must be >= 0, got {self.decay_min_delta}')

  def without_unused_optimizer_hparams(self) -> 'HParams':
    """These hyperparameters with the --client_/--server_ ones that their
    optimisers lack unset: for binaries that pass one set of flags to runs of
    several optimisers (fedgbo's SGD baselines beside its SGDm algorithms)."""
    unset = {}
    for side in ('client', 'server'):
      spec = getattr(self, f'{side}_optimizer_spec')(check_unused=False)
      unset.update({f'{side}_{field}': None for field in spec.unused()})
    return dataclasses.replace(self, **unset) if unset else self


@contextlib.contextmanager
def _flag_named(side: str):
  """A hyperparameter out of range, said as its flag: '--server_beta_1 must be
  in [0, 1) (adam), got 1.5' (TFF's builder raised it with a traceback after
  TensorFlow loaded)."""
  try:
    yield
  except optimizers.HyperparameterError as e:
    of = '' if e.field == 'learning_rate' else f' with --{side}_optimizer={e.optimizer}'
    raise ValueError(f'--{side}_{e.field} must be {e.rule}{of}, got {e.value}') from None


def _used(side: str, spec: optimizers.OptimizerSpec) -> optimizers.OptimizerSpec:
  """`spec`, refused (ValueError) if a --<side>_* flag sets a hyperparameter
  that its optimiser does not have (--server_momentum with sgd was dropped)."""
  unused = [f'--{side}_{field}' for field in spec.unused()]
  if unused:
    has = [f'--{side}_{f}' for f in optimizers.hyperparameters(spec.name)]
    raise ValueError(f'{", ".join(unused)} {"is" if len(unused) == 1 else "are"} not used '
                     f'by --{side}_optimizer={spec.name} (it takes '
                     f'{", ".join(has) if has else "only the learning rate"}); leave '
                     f'{"it" if len(unused) == 1 else "them"} unset'
                     + (f' or use --{side}_optimizer=sgdm' if spec.name == 'sgd' and
                        'momentum' in spec.unused() else ''))
  return spec


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One algorithm of the trainer: what the registry knows without TensorFlow.

  `module` (imported only to check the config or build) defines the class
  named `config`, whose `config.from_hparams(hp, **config_args)` makes the
  algorithm's config from the flag values (and checks them), and the function
  named `builder`, called as `builder(model_fn, config, name)`.
  """
  name: str
  module: str
  description: str
  config: str
  builder: str
  # Algorithm-specific flags it reads; an algorithm whose spec does not list a
  # flag that some other spec lists refuses it.
  reads: frozenset[str] = frozenset()
  # Flag rules that need no TensorFlow (raise ValueError); the config that
  # `module` builds checks the values themselves.
  check: Optional[Callable[[HParams], Any]] = None
  # The algorithm's own defaults: names of the flags left unset -> {flag: value}
  # for those where the generic default is not the paper's (or does not run).
  defaults: Optional[Callable[[frozenset[str]], dict[str, Any]]] = None
  # Keyword arguments of `config.from_hparams` that tell this algorithm from
  # others sharing its config class (a Theta preset, Mime's gradient, ...).
  config_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
