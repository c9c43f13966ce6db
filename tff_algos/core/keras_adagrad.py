"""Adagrad with epsilon outside the square root, as a `tff.learning` optimizer.

TFF's Adagrad divides by sqrt(acc + eps); Keras's, which Reddi et al.'s
FedAdagrad ran, divides by sqrt(acc) + eps. Kept apart from
`optimizers.py` so that flag validation does not load TensorFlow.
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


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
