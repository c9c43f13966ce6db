"""Adaptive gradient descent of Malitsky & Mishchenko (2020) as a TFF optimizer.

"Adaptive gradient descent without descent" (ICML 2020), Algorithm 1, applied
to whatever gradient estimate g_t the server receives at the model x_t:

    L_t     = ||g_t - g_{t-1}|| / ||x_t - x_{t-1}||
    eta_t   = min( sqrt(1 + theta_{t-1}) eta_{t-1},  1 / (2 L_t) )
    theta_t = eta_t / eta_{t-1}
    x_{t+1} = x_t - eta_t g_t

First step (no g_{t-1}): eta_0 is the given initial step and theta_0 = +inf,
as in the paper, so the second step is 1/(2 L_1). L_t = 0 (equal gradients)
leaves only the growth term sqrt(1 + theta) eta; if that is infinite too
(L_1 = 0 right after the first step) the step stays eta_{t-1}.

It is a `tff.learning.optimizers.Optimizer`, so TFF's
`build_apply_optimizer_finalizer` (or `core.finalizer`'s copy, as FedOpt uses)
turns it into the server `FinalizerProcess`
(rejecting non-finite updates, state untouched). The state holds
eta_{t-1} ('learning_rate', the optimizer hparam), theta_{t-1}, x_{t-1},
g_{t-1}, the step count and the last L_t ('smoothness', for logging).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


def _norm(structure) -> tf.Tensor:
  """Euclidean norm of a structure of tensors, in float64."""
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float64)))
                           for t in tf.nest.flatten(structure)]))


def _diff(a, b):
  return tf.nest.map_structure(tf.subtract, a, b)


class AdaptiveGD(tff.learning.optimizers.Optimizer):
  """x <- x - eta_t g with the Malitsky-Mishchenko step (module docstring)."""

  def __init__(self, learning_rate: float):
    if not learning_rate > 0:
      raise ValueError(f'initial learning rate must be > 0, got {learning_rate}')
    self._lr = float(learning_rate)

  def initialize(self, specs: Any):
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)
    return collections.OrderedDict([
        (LEARNING_RATE_KEY, tf.constant(self._lr, tf.float64)),
        ('theta', tf.constant(np.inf, tf.float64)),
        ('step', tf.constant(0, tf.int64)),
        ('smoothness', tf.constant(0.0, tf.float64)),
        ('prev_weights', zeros),
        ('prev_gradient', tf.nest.map_structure(tf.identity, zeros)),
    ])

  def next(self, state, weights, gradients):
    eta_prev, theta = state[LEARNING_RATE_KEY], state['theta']
    dx = _norm(_diff(weights, state['prev_weights']))
    dg = _norm(_diff(gradients, state['prev_gradient']))
    zero, one = tf.constant(0.0, tf.float64), tf.constant(1.0, tf.float64)
    inf = tf.constant(np.inf, tf.float64)
    # L_t = dg / dx, with dg = 0 -> 0 (growth term only) and dx = 0 < dg -> inf.
    smoothness = tf.where(dg > 0, dg / tf.where(dx > 0, dx, one), zero)
    smoothness = tf.where((dg > 0) & (dx == 0), inf, smoothness)
    inverse = tf.where(smoothness > 0, 0.5 / tf.where(smoothness > 0, smoothness, one),
                       inf)
    eta = tf.minimum(tf.sqrt(1.0 + theta) * eta_prev, inverse)
    eta = tf.where(tf.math.is_inf(eta), eta_prev, eta)
    first = tf.equal(state['step'], 0)
    eta = tf.where(first, eta_prev, eta)
    new_theta = tf.where(first, theta, tf.math.divide_no_nan(eta, eta_prev))
    new_weights = tf.nest.map_structure(
        lambda w, g: w - tf.cast(eta, w.dtype) * g, weights, gradients)
    new_state = collections.OrderedDict([
        (LEARNING_RATE_KEY, eta),
        ('theta', new_theta),
        ('step', state['step'] + 1),
        ('smoothness', tf.where(first, zero, smoothness)),
        ('prev_weights', tf.nest.map_structure(tf.identity, weights)),
        ('prev_gradient', tf.nest.map_structure(tf.identity, gradients)),
    ])
    return new_state, new_weights

  def get_hparams(self, state):
    return collections.OrderedDict([(LEARNING_RATE_KEY, state[LEARNING_RATE_KEY])])

  def set_hparams(self, state, hparams):
    state = collections.OrderedDict(state)
    state[LEARNING_RATE_KEY] = tf.cast(hparams[LEARNING_RATE_KEY], tf.float64)
    return state
