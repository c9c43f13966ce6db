"""LocalUpdate's and LocalUpdateDecay's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import DECAY, at_least, hparam, redefault, refuse, reuse

PRESETS = ('reptile', 'fomaml', 'kmaml', 'minibatch_sgd')


def theta_preset(name: str, k: int) -> np.ndarray:
  """Theta for a named preset with K local steps (K-MAML runs 2K + 1 steps)."""
  if k < 1:
    raise refuse('K ({local_steps}) must be >= 1, got {value}', value=k)
  if name == 'reptile':
    return np.ones(k, np.float32)
  if name == 'fomaml':
    return np.eye(k, dtype=np.float32)[-1]
  if name == 'kmaml':
    return np.eye(2 * k + 1, dtype=np.float32)[-1]
  if name == 'minibatch_sgd':
    return np.ones(1, np.float32)
  raise refuse('unknown Theta preset {value!r} ({theta}); choose one of %s' % ', '.join(PRESETS),
               value=name)


def parse_theta(spec: Union[str, Sequence[float]], k: int) -> np.ndarray:
  """A preset name or explicit weights ('1,0,0.5'); trailing zeros dropped."""
  if isinstance(spec, str) and spec in PRESETS:
    theta = theta_preset(spec, k)
  else:
    values = spec.split(',') if isinstance(spec, str) else spec
    try:
      theta = np.asarray([float(v) for v in values], np.float32)
    except ValueError:
      raise refuse('{theta} must be one of %s or comma-separated numbers, got {value!r}'
                   % ', '.join(PRESETS), value=spec) from None
  if (theta.ndim != 1 or not theta.size or not np.isfinite(theta).all() or (theta < 0).any()
      or not (theta > 0).any()):
    raise refuse('Theta ({theta}) needs finite non-negative weights with one > 0, got {value!r}',
                 value=spec)
  return theta[:np.flatnonzero(theta)[-1] + 1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalUpdateConfig(groups.ClientSGD, groups.ServerOptimizer, groups.Weighting):
  """LocalUpdate(x, eta, gamma, Theta): K(Theta) local SGD steps at gamma, the
  server optimiser at eta on the mean of q_i = sum_k theta_k g_k. The clients'
  mean is plain (paper 002); `decay_reference_semantics` (the authors' code)
  weights it by n_i, which `uniform_weighting` turns back off.

  eta defaults to gamma's default, 0.1: q_i is in gradient units, so with
  Theta_{1:K} eta = gamma is FedAvg with server learning rate 1 (q_i =
  (x_t - x_{K+1}) / gamma; paper 002 §2.1), and with the one-gradient presets
  (Theta_K, Theta_{2K+1}, Theta_1) a step at the clients' rate. The server
  optimiser's own default, eta = 1, steps 1/gamma = 10 times as far as FedAvg
  with Theta_{1:K} (on the default task, digits' MLP, the eval loss rises from 2.3
  to 13 in 3 rounds) and leaves K-MAML at its initial loss."""
  theta: Union[str, tuple[float, ...]] = hparam(
      'reptile', 'LocalUpdate step weights: reptile, fomaml, kmaml, minibatch_sgd (K = '
                 '--local_steps, default 10) or numbers "1,0,0.5".')
  local_steps: Optional[int] = reuse(groups.LocalWork, 'local_steps', 10)  # K (None: 10)
  server_learning_rate: float = redefault(0.1)      # eta = gamma (the docstring says why)
  decay_reference_semantics: bool = hparam(
      False, "LocalUpdateDecay: the reference code's rule (Keras's best, moved only by "
             "improvements > Delta; window starts at inf; example-weighted means unless "
             "--uniform_weighting) instead of the paper's eq. 25 (running minimum).")
  measure_pre_training_loss: bool = False           # LocalUpdate: report l_t too
  WHY_NOT = groups.why_not({
      (*groups.CLIENT_OPTIMIZER_FLAGS, 'local_steps_decay', 'client_lr_decay',
       'server_lr_decay'):
      'LocalUpdate runs client SGD at gamma; use --server_optimizer / the decay_* flags'})
  MOVES_AT_ZERO_CLIENT_RATE = True

  def check(self):
    self.theta_weights()

  def theta_weights(self) -> np.ndarray:
    """Theta: the preset's weights for K = `local_steps`, or the weights given."""
    return parse_theta(self.theta, 10 if self.local_steps is None else self.local_steps)

  @property
  def example_weighted(self) -> bool:
    """Whether q_t and l_t are n_i-weighted means (the reference code's)."""
    return self.decay_reference_semantics and not self.uniform_weighting

  def shared_build_key(self) -> 'LocalUpdateConfig':
    """This config with gamma and eta (read from the state: the schedule's and
    TFF's finalizer's) fixed: configs with equal keys share one build
    (`registry.BuildCache`), e.g. paper 002's gamma x eta grids."""
    return dataclasses.replace(self, client_learning_rate=1.0, server_learning_rate=1.0)

  def client_schedule(self):
    """gamma and K(Theta) local steps, both constant (TensorFlow: for the builders)."""
    from tff_algos.core import client_work, schedules  # pylint: disable=g-import-not-at-top
    return client_work.ClientSchedule(
        learning_rate=schedules.ExponentialDecay(self.client_learning_rate),
        local_steps=schedules.LocalSteps(len(self.theta_weights())))

  def schedule_values(self):
    return self.client_schedule().state_values()

  def shared_server_learning_rate(self) -> float:
    return self.server_learning_rate


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalUpdateDecayConfig(LocalUpdateConfig):
  """LocalUpdate's round with gamma and eta decayed on plateaus of the clients'
  pre-training loss (Alg. 3-4; paper defaults)."""
  decay_min_delta: float = hparam(1e-4, 'LocalUpdateDecay: improvement threshold Delta.',
                                  valid=at_least(0))
  client_lr_decay_factor: float = hparam(0.1, 'LocalUpdateDecay: gamma <- alpha gamma.',
                                         valid=DECAY)
  server_lr_decay_factor: float = hparam(0.9, 'LocalUpdateDecay: eta <- beta eta.',
                                         valid=DECAY)
  decay_patience: int = hparam(100, 'LocalUpdateDecay: patience P (rounds).', valid=at_least(0))
  decay_window: int = hparam(100, 'LocalUpdateDecay: moving-average window W.',
                             valid=at_least(1))
  decay_cooldown: int = hparam(100, 'LocalUpdateDecay: cooldown C (also at start).',
                               valid=at_least(0))

  @property
  def semantics(self) -> str:
    """The plateau rule: eq. 25 ('paper') or the authors' code ('reference')."""
    return 'reference' if self.decay_reference_semantics else 'paper'

  # Built once per config: the plateau states start from gamma and eta, which
  # are constants of the build.
  shared_build_key = None


_THETA = {'reptile': 'Theta_{1:K}: FedAvg/Reptile (q in gradient units)',
          'fomaml': 'Theta_K: first-order MAML', 'kmaml': 'Theta_{2K+1}: K-MAML',
          'minibatch_sgd': 'Theta_1: distributed minibatch SGD'}
ALGORITHMS = (
    Algorithm('local_update', LocalUpdateConfig, 'build_local_update',
              'LocalUpdate with --theta (preset or weights), server optimizer'),
    *(Algorithm(name, LocalUpdateConfig, 'build_local_update', f'LocalUpdate, {what}',
                {'theta': name}) for name, what in _THETA.items()),
    Algorithm('local_update_decay', LocalUpdateDecayConfig, 'build_local_update_decay',
              'LocalUpdateDecay: plateau decay of gamma and eta on the pre-training loss'),
)
