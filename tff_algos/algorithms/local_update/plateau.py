"""ReduceLROnPlateau on a moving window, in TensorFlow, kept in server state.

Paper 002 (LocalUpdateDecay, Alg. 3-4 and §9.1) and the reference code
(google-research/federated adaptive_lr_decay/callbacks.py). One update, for a
new monitored value m (mode 'min'; 'max' flips every comparison):

    window <- window[1:] + [m];   avg = mean(window)
    if cooldown_counter > 0:  cooldown_counter -= 1;  wait = 0
    improved = avg < best - delta
    best = min(best, avg)                  ('paper')
           avg if improved else best       ('reference')
    if improved:  wait = 0
    elif cooldown_counter <= 0:
        wait += 1
        if wait >= patience and lr > min_lr:
            lr = max(lr * decay_factor, min_lr);  cooldown_counter = cooldown;  wait = 0

Initially wait = 0 and cooldown_counter = cooldown (no decay during the first
`cooldown` rounds). The two `semantics`:

* 'paper' (eq. 25): `best` is the running minimum of every previous windowed
  value, min_{j<t} avg_j, so the counter grows while avg_t > min_{j<t} avg_j -
  delta. The window averages the values seen so far (the paper's W-round
  average, over fewer rounds until W have arrived; the paper is silent there)
  and best starts at +-inf.
* 'reference' (the authors' code, Keras's ReduceLROnPlateau): `best` moves
  only on an improvement larger than delta, so a loss falling steadily by less
  than delta per round never resets the counter against the latest value. In
  min mode best and every window slot start at +inf (the average stays +inf
  until W values have arrived), in max mode at 0.0.

The two differ whenever the windowed loss falls by between about delta/P and
delta per round: the paper's rule then decays, the reference code's does not.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

SEMANTICS = ('paper', 'reference')


@dataclasses.dataclass(frozen=True)
class PlateauConfig:
  initial_lr: float
  decay_factor: float = 0.1
  min_delta: float = 1e-4
  window_size: int = 100
  patience: int = 100
  cooldown: int = 100
  min_lr: float = 0.0
  mode: str = 'min'
  semantics: str = 'paper'

  def __post_init__(self):
    if self.mode not in ('min', 'max'):
      raise ValueError(f"plateau mode must be 'min' or 'max', got {self.mode!r}")
    if self.semantics not in SEMANTICS:
      raise ValueError(f'plateau semantics must be one of {SEMANTICS}, '
                       f'got {self.semantics!r}')
    if self.window_size < 1 or self.patience < 0 or self.cooldown < 0:
      raise ValueError('plateau needs window_size >= 1, patience >= 0, cooldown >= 0')
    if not 0 < self.decay_factor <= 1:
      raise ValueError(f'decay factor must be in (0, 1], got {self.decay_factor}')
    if self.initial_lr < 0 or self.min_delta < 0:
      raise ValueError('plateau needs initial_lr >= 0 and min_delta >= 0')

  @property
  def _sign(self) -> float:
    return 1.0 if self.mode == 'min' else -1.0


def initial_state(config: PlateauConfig) -> collections.OrderedDict:
  if config.semantics == 'reference':
    worst = np.inf if config.mode == 'min' else 0.0
    fill = worst
  else:
    worst = config._sign * np.inf  # pylint: disable=protected-access
    fill = 0.0
  return collections.OrderedDict(
      window=tf.fill([config.window_size], tf.constant(fill, tf.float32)),
      count=tf.constant(0, tf.int32),
      best=tf.constant(worst, tf.float32),
      wait=tf.constant(0, tf.int32),
      cooldown_counter=tf.constant(config.cooldown, tf.int32),
      lr=tf.constant(config.initial_lr, tf.float32))


def _windowed(state, value, config: PlateauConfig):
  window = tf.concat([state['window'][1:], tf.reshape(value, [1])], axis=0)
  count = tf.minimum(state['count'] + 1, config.window_size)
  if config.semantics == 'reference':
    avg = tf.reduce_mean(window)
  else:
    avg = tf.reduce_sum(window[config.window_size - count:]) / tf.cast(count, tf.float32)
  return window, count, avg


def update(state, value, config: PlateauConfig) -> collections.OrderedDict:
  """One plateau step with monitored `value` (a float32 scalar tensor)."""
  sign = tf.constant(config._sign, tf.float32)  # pylint: disable=protected-access
  window, count, avg = _windowed(state, tf.cast(value, tf.float32), config)

  cooling = state['cooldown_counter'] > 0
  cooldown_counter = tf.where(cooling, state['cooldown_counter'] - 1,
                              state['cooldown_counter'])
  wait = tf.where(cooling, 0, state['wait'])
  improved = sign * avg < sign * state['best'] - config.min_delta
  if config.semantics == 'paper':
    best = sign * tf.minimum(sign * state['best'], sign * avg)
  else:
    best = tf.where(improved, avg, state['best'])
  counting = tf.logical_and(tf.logical_not(improved), cooldown_counter <= 0)
  wait = tf.where(improved, 0, tf.where(counting, wait + 1, wait))
  decay = tf.logical_and(tf.logical_and(counting, wait >= config.patience),
                         state['lr'] > config.min_lr)
  lr = tf.where(decay, tf.maximum(state['lr'] * config.decay_factor, config.min_lr),
                state['lr'])
  cooldown_counter = tf.where(decay, config.cooldown, cooldown_counter)
  wait = tf.where(decay, 0, wait)
  return collections.OrderedDict(window=window, count=count, best=best, wait=wait,
                                 cooldown_counter=cooldown_counter, lr=lr)
