"""Optimisers with global, locally fixed statistics (paper 004, Table II).

Mills et al., "Accelerating Federated Learning with a Global Biased
Optimiser": an optimiser is its statistics s plus three steps (and M, MFL's),

  U(eta, g, s)               client step with s FIXED:   y <- y - U
  T(g, s)                    server tracking:            s <- T(g, s)
  I(x_t - x_{t+1}, s, K, eta)  inverse of K U-steps: the average gradient g
  M(eta, g, s)               step with MOVING statistics (MFL): s <- T(g, s),
                             then y <- y - M(eta, g, s) with the new s

  SGDm     s = m     U = eta (beta m + (1-beta) g)
                     T  m <- beta m + (1-beta) g
                     I  ((x_t - x_{t+1})/(eta K) - beta m) / (1-beta)
                     M  eta m
  RMSProp  s = v     U = eta g / (sqrt v + eps)
                     T  v <- beta v + (1-beta) g^2
                     I  (x_t - x_{t+1}) (sqrt v + eps) / (eta K)
                     M  eta g / (sqrt v + eps)
  Adam     s = m, v  U = eta (b1 m + (1-b1) g) / (sqrt v + eps)
                     T  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2
                     I  ((x_t - x_{t+1}) (sqrt v + eps)/(eta K) - b1 m) / (1-b1)
                     M  eta m / (sqrt v + eps)

Adding an optimiser is one small class here. FedGBO tracks s with the
inverse-step gradient, Mimelite with the clients' full-batch gradients; MFL
tracks it at every local step and averages it (`MovingStatistics`: the
authors' MFL optimisers, e.g. the dampened SGDm m <- beta m + (1-beta) g,
y <- y - eta m, where TFF's SGDm is m <- beta m + g).

Conventions. Table II leaves s_0 open. By default the statistics start at 0
and the second moments (RMSProp v; Adam m and v) are bias-corrected as in
Adam: U, I and M use m/(1-b1^t), v/(1-b2^t) after t tracking steps; before the
first one (t = 0) m = 0 and the preconditioner is the identity (v-hat = 1).
The authors' code (JedMills/FedGBO) instead starts v at 1 and never
corrects (`bias_correction=False, initial_v=1`). SGDm is never corrected
(momentum SGD has no bias correction). C_fixed / C_moving are the optimiser
FLOPs per parameter and local step of App. B, Table VI (fixed statistics:
FedGBO, Mimelite; moving: MFL): SGDm 5 / 8, RMSProp 5 / 5, Adam 8 / 11.
(The prose of App. B says 4 for SGDm and 8 for MFL-RMSProp; Table VI is used
because the FLOP totals of Table VII agree with it.)

The statistics are an OrderedDict(count=int32 t, m=..., v=...) whose m, v
have the structure of the trainable weights; all functions are plain
TensorFlow. `FixedStatistics` wraps U (and `MovingStatistics` T then M) as a
`tff.learning.optimizers.Optimizer` so the shared client loop runs it.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

NAMES = ('sgdm', 'rmsprop', 'adam')


def _map(fn, first, *rest):
  """map_structure over the leaves, in the structure of `first` (lists and
  tuples of the same tensors mix: TFF hands either)."""
  leaves = zip(tf.nest.flatten(first), *(tf.nest.flatten(r) for r in rest))
  return tf.nest.pack_sequence_as(first, [fn(*xs) for xs in leaves])


def _debiased(values, beta, count, at_zero):
  """values / (1 - beta^t) for t >= 1; `at_zero` (a constant) for t = 0.

  One branch runs (a cond on the scalar t), not both and a select: at every
  local step of MFL that saved a fill and a select per statistic tensor.
  """
  def corrected():
    return _map(lambda x: x / (1.0 - tf.pow(tf.constant(beta, x.dtype),
                                            tf.cast(count, x.dtype))), values)

  def initial():
    return _map(lambda x: tf.fill(tf.shape(x), tf.cast(at_zero, x.dtype)), values)
  return tf.cond(count > 0, corrected, initial)


class GBOOptimizer(abc.ABC):
  """Statistics + update U + tracking T + inverse I of one optimiser."""

  name: str
  statistic_names: tuple[str, ...]
  flops_fixed: float    # C_Fixed: optimiser ops per parameter and step (App. B)
  flops_moving: float   # C_Moving: the same optimiser with moving statistics (MFL)

  def initialize(self, specs) -> collections.OrderedDict:
    """s_0 for weights of `specs` (a structure of TensorSpecs)."""
    stats = collections.OrderedDict(count=tf.constant(0, tf.int32))
    for name in self.statistic_names:
      value = self.initial_value(name)
      stats[name] = _map(lambda s, v=value: tf.fill(s.shape, tf.constant(v, s.dtype)), specs)
    return stats

  def initial_value(self, name: str) -> float:
    del name
    return 0.0

  def prepare(self, stats):
    """s in the form U uses it (RMSProp: sqrt(v-hat) + eps; Adam: m-hat and
    sqrt(v-hat) + eps). `FixedStatistics` computes it once per client, not at
    every local step: s_t does not change during local training."""
    return stats

  @abc.abstractmethod
  def update(self, learning_rate, grads, prepared):
    """U(eta, g, s), given prepared = prepare(s): the step subtracted from the weights."""

  @abc.abstractmethod
  def inverse(self, delta, stats, learning_rate, num_steps):
    """I: the average local gradient from delta = x_t - x_{t+1} after K U-steps."""

  @abc.abstractmethod
  def track(self, stats, grads) -> collections.OrderedDict:
    """T(g, s): the next statistics (count + 1)."""

  @abc.abstractmethod
  def moving_update(self, learning_rate, grads, stats):
    """M(eta, g, s): the step with statistics `stats` = T(g, s_old) (MFL)."""


@dataclasses.dataclass(frozen=True)
class SGDm(GBOOptimizer):
  beta: float = 0.9
  name = 'sgdm'
  statistic_names = ('m',)
  flops_fixed = 5
  flops_moving = 8

  def __post_init__(self):
    _check_beta('SGDm beta', self.beta)

  def update(self, learning_rate, grads, prepared):
    b = self.beta
    return _map(lambda g, m: learning_rate * (b * m + (1.0 - b) * g), grads, prepared['m'])

  def inverse(self, delta, stats, learning_rate, num_steps):
    b, k = self.beta, tf.cast(num_steps, tf.float32)
    return _map(lambda d, m: (d / (learning_rate * k) - b * m) / (1.0 - b),
                delta, stats['m'])

  def track(self, stats, grads):
    b = self.beta
    return collections.OrderedDict(
        count=stats['count'] + 1,
        m=_map(lambda m, g: b * m + (1.0 - b) * g, stats['m'], grads))

  def moving_update(self, learning_rate, grads, stats):
    return _map(lambda m: learning_rate * m, stats['m'])


@dataclasses.dataclass(frozen=True)
class RMSProp(GBOOptimizer):
  beta: float = 0.9
  epsilon: float = 1e-3
  bias_correction: bool = True
  initial_v: float = 0.0
  name = 'rmsprop'
  statistic_names = ('v',)
  flops_fixed = 5
  flops_moving = 5

  def __post_init__(self):
    _check_beta('RMSProp beta', self.beta)
    _check_second_moment(self.epsilon, self.bias_correction, self.initial_v)

  def initial_value(self, name):
    return self.initial_v

  def prepare(self, stats):
    v = stats['v']
    if self.bias_correction:
      v = _debiased(v, self.beta, stats['count'], 1.0)
    return collections.OrderedDict(denominator=_map(lambda x: tf.sqrt(x) + self.epsilon, v))

  def update(self, learning_rate, grads, prepared):
    return _map(lambda g, d: learning_rate * g / d, grads, prepared['denominator'])

  def inverse(self, delta, stats, learning_rate, num_steps):
    k = tf.cast(num_steps, tf.float32)
    return _map(lambda x, d: x * d / (learning_rate * k), delta,
                self.prepare(stats)['denominator'])

  def track(self, stats, grads):
    b = self.beta
    return collections.OrderedDict(
        count=stats['count'] + 1,
        v=_map(lambda v, g: b * v + (1.0 - b) * tf.square(g), stats['v'], grads))

  def moving_update(self, learning_rate, grads, stats):
    return self.update(learning_rate, grads, self.prepare(stats))


@dataclasses.dataclass(frozen=True)
class Adam(GBOOptimizer):
  beta_1: float = 0.9
  beta_2: float = 0.99
  epsilon: float = 1e-3
  bias_correction: bool = True
  initial_v: float = 0.0
  name = 'adam'
  statistic_names = ('m', 'v')
  flops_fixed = 8
  flops_moving = 11

  def __post_init__(self):
    _check_beta('Adam beta_1', self.beta_1)
    _check_beta('Adam beta_2', self.beta_2)
    _check_second_moment(self.epsilon, self.bias_correction, self.initial_v)

  def initial_value(self, name):
    return self.initial_v if name == 'v' else 0.0

  def prepare(self, stats):
    m, v = stats['m'], stats['v']
    if self.bias_correction:
      m = _debiased(m, self.beta_1, stats['count'], 0.0)
      v = _debiased(v, self.beta_2, stats['count'], 1.0)
    return collections.OrderedDict(m=m, denominator=_map(lambda x: tf.sqrt(x) + self.epsilon, v))

  def update(self, learning_rate, grads, prepared):
    b1 = self.beta_1
    return _map(lambda g, m, d: learning_rate * (b1 * m + (1.0 - b1) * g) / d,
                grads, prepared['m'], prepared['denominator'])

  def inverse(self, delta, stats, learning_rate, num_steps):
    b1, k = self.beta_1, tf.cast(num_steps, tf.float32)
    p = self.prepare(stats)
    return _map(lambda x, m, d: (x * d / (learning_rate * k) - b1 * m) / (1.0 - b1),
                delta, p['m'], p['denominator'])

  def track(self, stats, grads):
    b1, b2 = self.beta_1, self.beta_2
    return collections.OrderedDict(
        count=stats['count'] + 1,
        m=_map(lambda m, g: b1 * m + (1.0 - b1) * g, stats['m'], grads),
        v=_map(lambda v, g: b2 * v + (1.0 - b2) * tf.square(g), stats['v'], grads))

  def moving_update(self, learning_rate, grads, stats):
    del grads  # in m already
    p = self.prepare(stats)
    return _map(lambda m, d: learning_rate * m / d, p['m'], p['denominator'])


def _check_beta(what, beta):
  if not 0.0 <= beta < 1.0:
    raise ValueError(f'{what} must be in [0, 1), got {beta}')


def _check_second_moment(epsilon, bias_correction, initial_v):
  if not epsilon > 0:
    raise ValueError(f'epsilon must be > 0, got {epsilon}')
  if initial_v < 0:
    raise ValueError(f'initial v must be >= 0, got {initial_v}')
  if bias_correction and initial_v != 0:
    raise ValueError('bias correction assumes statistics starting at 0 '
                     f'(got initial v {initial_v})')


def build(name: str, *, beta_1=None, beta_2=None, epsilon=None,
          reference_conventions: bool = False) -> GBOOptimizer:
  """The named optimiser; None takes the default (paper 004: beta_2 = .99, eps = 1e-3).

  SGDm's beta is `beta_1`. `reference_conventions`: v_0 = 1, no bias
  correction and eps = 1e-3, as in the authors' code.
  """
  if name not in NAMES:
    raise ValueError(f'FedGBO/Mimelite need a client optimizer with statistics, one of '
                     f'{NAMES}; got {name!r}')
  if reference_conventions:
    if epsilon not in (None, 1e-3):
      raise ValueError(f'the reference conventions fix epsilon = 1e-3, got {epsilon}')
    second = dict(bias_correction=False, initial_v=1.0, epsilon=1e-3)
  else:
    second = dict(epsilon=1e-3 if epsilon is None else epsilon)
  if name == 'sgdm':
    if beta_2 is not None or epsilon is not None:
      raise ValueError('SGDm has one statistic: set its beta with --client_momentum '
                       '(not client_beta_2/client_epsilon)')
    return SGDm(0.9 if beta_1 is None else beta_1)
  if name == 'rmsprop':
    if beta_1 is not None:
      raise ValueError('RMSProp has no first moment: set its decay with client_beta_2')
    return RMSProp(0.9 if beta_2 is None else beta_2, **second)
  return Adam(0.9 if beta_1 is None else beta_1, 0.99 if beta_2 is None else beta_2,
              **second)


class _LearningRateOptimizer(tff.learning.optimizers.Optimizer):
  """A TFF optimiser whose only hyperparameter is its learning rate."""

  def get_hparams(self, state):
    return collections.OrderedDict(learning_rate=state['learning_rate'])

  def set_hparams(self, state, hparams):
    state = collections.OrderedDict(state)
    state['learning_rate'] = tf.cast(hparams['learning_rate'], tf.float32)
    return state


class FixedStatistics(_LearningRateOptimizer):
  """U as a TFF optimiser: state = learning rate + the fixed statistics s_t.

  `next` applies y <- y - U(eta, g, s) and returns the state unchanged (the
  statistics are fixed during local training), as TFF's Mime Lite does. The
  state holds s_t as U uses it (`prepare`, once per client: Adam's
  bias-corrected moments and sqrt(v-hat) + eps are loop-invariant).
  """

  def __init__(self, rule: GBOOptimizer, statistics: Any, learning_rate: float = 0.1):
    self._rule = rule
    self._statistics = statistics
    self._learning_rate = learning_rate

  def initialize(self, specs):
    del specs
    return collections.OrderedDict(
        learning_rate=tf.constant(self._learning_rate, tf.float32),
        statistics=self._rule.prepare(self._statistics))

  def next(self, state, weights, gradients):
    step = self._rule.update(state['learning_rate'], gradients, state['statistics'])
    return state, _map(tf.subtract, weights, step)


class MovingStatistics(_LearningRateOptimizer):
  """T then M as a TFF optimiser: the statistics move with every step (MFL).

  State: the learning rate and the statistics side by side (count, m and/or
  v), so that MFL averages the per-weight ones like a TFF optimiser's state.
  """

  def __init__(self, rule: GBOOptimizer, learning_rate: float = 0.1):
    self._rule = rule
    self._learning_rate = learning_rate

  def initialize(self, specs):
    state = collections.OrderedDict(
        learning_rate=tf.constant(self._learning_rate, tf.float32))
    state.update(self._rule.initialize(specs))
    return state

  def next(self, state, weights, gradients):
    structure = lambda s: tf.nest.pack_sequence_as(weights, tf.nest.flatten(s))
    stats = collections.OrderedDict(count=state['count'])
    stats.update((k, structure(state[k])) for k in self._rule.statistic_names)
    stats = self._rule.track(stats, gradients)
    step = self._rule.moving_update(state['learning_rate'], gradients, stats)
    new = collections.OrderedDict(learning_rate=state['learning_rate'], count=stats['count'])
    new.update((k, tf.nest.pack_sequence_as(state[k], tf.nest.flatten(stats[k])))
               for k in self._rule.statistic_names)
    return new, _map(tf.subtract, weights, step)


def of_config(config) -> GBOOptimizer:
  """The optimiser of a config's client_* fields (`gbo.config.StatisticsOptimizer`),
  or its own `optimizer`. SGDm's beta is --client_momentum."""
  if config.optimizer is not None:
    return config.optimizer
  name = config.client_optimizer
  beta_1 = config.client_momentum if name == 'sgdm' else config.client_beta_1
  return build(name, beta_1=beta_1, beta_2=config.client_beta_2,
               epsilon=config.client_epsilon,
               reference_conventions=config.reference_conventions)
