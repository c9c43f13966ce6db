"""Optimiser names -> `tff.learning.optimizers`.

`OptimizerSpec` holds what a flag set can say about an optimiser; unspecified
fields take the paper defaults listed in `_DEFAULTS` (FedAdam of paper 000:
beta_1=.9, beta_2=.999, eps=1e-8; Yogi of paper 002: beta_2=.99, eps=1e-5,
initial accumulator 0).

Where epsilon goes: Adam, Yogi and RMSProp (TFF's) divide by sqrt(v) + eps.
'adagrad' does the same, w <- w - lr g / (sqrt(acc) + eps): Keras's Adagrad,
which Reddi et al.'s FedAdagrad ran (their tuned eps values assume it), and
Duchi et al.'s delta. TFF's own Adagrad divides by sqrt(acc + eps) instead;
it is 'adagrad_tff'. The one optimiser written here is `KerasAdagrad`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


NAMES = ('sgd', 'sgdm', 'adam', 'yogi', 'adagrad', 'adagrad_tff', 'rmsprop')

_DEFAULTS = {
    'sgd': {},
    'sgdm': dict(momentum=0.9),
    'adam': dict(beta_1=0.9, beta_2=0.999, epsilon=1e-8),
    'yogi': dict(beta_1=0.9, beta_2=0.99, epsilon=1e-5, initial_accumulator=0.0),
    'adagrad': dict(epsilon=1e-7, initial_accumulator=0.0),
    'adagrad_tff': dict(epsilon=1e-7, initial_accumulator=0.0),
    'rmsprop': dict(beta_2=0.9, epsilon=1e-7),
}


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  name: str = 'sgd'
  learning_rate: float = 1.0
  momentum: Optional[float] = None
  beta_1: Optional[float] = None
  beta_2: Optional[float] = None      # RMSProp: the decay of its average
  epsilon: Optional[float] = None
  initial_accumulator: Optional[float] = None

  def __post_init__(self):
    if self.name not in NAMES:
      raise ValueError(f'unknown optimizer {self.name!r}; choose one of {NAMES}')
    if not self.learning_rate >= 0:
      raise ValueError(f'learning rate must be >= 0, got {self.learning_rate}')

  def get(self, field: str):
    value = getattr(self, field)
    return _DEFAULTS[self.name].get(field) if value is None else value

  def build(self) -> tff.learning.optimizers.Optimizer:
    lr, g = self.learning_rate, self.get
    if self.name == 'sgd':
      return tff.learning.optimizers.build_sgdm(learning_rate=lr)
    if self.name == 'sgdm':
      return tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=g('momentum'))
    if self.name == 'adam':
      return tff.learning.optimizers.build_adam(
          learning_rate=lr, beta_1=g('beta_1'), beta_2=g('beta_2'), epsilon=g('epsilon'))
    if self.name == 'yogi':
      return tff.learning.optimizers.build_yogi(
          learning_rate=lr, beta_1=g('beta_1'), beta_2=g('beta_2'), epsilon=g('epsilon'),
          initial_preconditioner_value=g('initial_accumulator'))
    if self.name == 'adagrad':
      return KerasAdagrad(lr, epsilon=g('epsilon'),
                          initial_accumulator=g('initial_accumulator'))
    if self.name == 'adagrad_tff':
      return tff.learning.optimizers.build_adagrad(
          learning_rate=lr, epsilon=g('epsilon'),
          initial_preconditioner_value=g('initial_accumulator'))
    return tff.learning.optimizers.build_rmsprop(
        learning_rate=lr, decay=g('beta_2'), epsilon=g('epsilon'))


class KerasAdagrad(tff.learning.optimizers.Optimizer):
  """Adagrad with epsilon outside the square root (Keras's; Reddi et al.'s).

      acc <- acc + g^2
      w   <- w - lr g / (sqrt(acc) + eps)

  State and hyperparameters are laid out as TFF's Adagrad ('learning_rate',
  'epsilon', 'preconditioner'), so TFF's learning-rate schedules apply.
  """

  def __init__(self, learning_rate: float, epsilon: float = 1e-7,
               initial_accumulator: float = 0.0):
    for name, value in (('learning rate', learning_rate), ('epsilon', epsilon),
                        ('initial accumulator', initial_accumulator)):
      if not value >= 0:
        raise ValueError(f'Adagrad {name} must be >= 0, got {value}')
    self._lr, self._epsilon = learning_rate, epsilon
    self._initial = initial_accumulator

  def initialize(self, specs: Any):
    return collections.OrderedDict([
        (LEARNING_RATE_KEY, self._lr),
        ('epsilon', self._epsilon),
        ('preconditioner', tf.nest.map_structure(
            lambda s: tf.fill(s.shape, tf.cast(self._initial, s.dtype)), specs)),
    ])

  def next(self, state, weights, gradients):
    lr, eps = state[LEARNING_RATE_KEY], state['epsilon']

    def step(w, acc, g):
      acc = acc + tf.square(g)
      return w - tf.cast(lr, g.dtype) * g / (tf.sqrt(acc) + tf.cast(eps, g.dtype)), acc

    flat = [step(w, a, g) for w, a, g in zip(tf.nest.flatten(weights),
                                             tf.nest.flatten(state['preconditioner']),
                                             tf.nest.flatten(gradients))]
    new_weights = tf.nest.pack_sequence_as(weights, [w for w, _ in flat])
    new_state = collections.OrderedDict(state)
    new_state['preconditioner'] = tf.nest.pack_sequence_as(
        state['preconditioner'], [a for _, a in flat])
    return new_state, new_weights

  def get_hparams(self, state):
    return collections.OrderedDict(
        [(k, state[k]) for k in (LEARNING_RATE_KEY, 'epsilon')])

  def set_hparams(self, state, hparams):
    state = collections.OrderedDict(state)
    state.update(hparams)
    return state
