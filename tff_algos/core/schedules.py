"""Round-indexed schedules (paper 000): K_t, gamma_t, eta_t as functions of t.

Each schedule is a tiny frozen dataclass callable on a round number, either a
Python int (host side: planning, accounting) or a scalar tensor (inside a TFF
computation, where the round number comes from server state so that one
compiled computation serves every round). Both paths compute in float64 and
round up with the same tolerant ceiling (`CEIL_RTOL`), so the host and the
graph agree on ceil() boundaries.
"""

from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np
import tensorflow as tf

Round = Union[int, np.integer, tf.Tensor]

# K_0 d_K^t is often an integer in exact arithmetic (100 * 0.8^2 = 64) but a few
# ulps above it in float64 (64.00000000000001), where a plain ceil() would give
# one step too many. The ceiling therefore forgives a relative excess of
# CEIL_RTOL: ceil(x - CEIL_RTOL * x). Float64 error of K_0 d^t stays below
# ~1e-12 relative for t <= 10^4, far under 1e-9, and a value that exceeds an
# integer by less than 1e-9 relative on purpose does not occur in practice.
CEIL_RTOL = 1e-9


def _of_tensors(cls, initial, decay):
  """A schedule holding tensors (read from a state inside a computation),
  not checked: the checked Python schedule put them there."""
  schedule = object.__new__(cls)
  object.__setattr__(schedule, 'initial', initial)
  object.__setattr__(schedule, 'decay', decay)
  return schedule


def tolerant_ceil(x):
  """ceil(x - CEIL_RTOL * |x|) of a float64 scalar/array or tensor."""
  if isinstance(x, (tf.Tensor, tf.Variable)):
    return tf.math.ceil(x - CEIL_RTOL * tf.abs(x))
  x = np.asarray(x, np.float64)
  return np.ceil(x - CEIL_RTOL * np.abs(x))


@dataclasses.dataclass(frozen=True)
class ExponentialDecay:
  """value_t = initial * decay**t (constant when decay == 1)."""

  initial: float
  decay: float = 1.0

  def __post_init__(self):
    if not self.initial >= 0:
      raise ValueError(f'initial value must be >= 0, got {self.initial}')
    if not 0 < self.decay <= 1:
      raise ValueError(f'decay must be in (0, 1], got {self.decay}')

  @classmethod
  def of_tensors(cls, initial: tf.Tensor, decay: tf.Tensor) -> 'ExponentialDecay':
    return _of_tensors(cls, initial, decay)

  @property
  def constant(self) -> bool:
    return self.decay == 1.0

  def __call__(self, t: Round):
    if isinstance(t, (tf.Tensor, tf.Variable)):
      t64 = tf.cast(t, tf.float64)
      return tf.cast(self.initial * tf.pow(tf.convert_to_tensor(self.decay, tf.float64), t64),
                     tf.float32)
    return float(self.initial * self.decay ** int(t))


@dataclasses.dataclass(frozen=True)
class StepDecay:
  """value_t = initial * factor**(number of milestones <= t): PyTorch's MultiStepLR
  with the round as its epoch (paper 001: 0.2, divided by 10 at epochs 150, 200)."""

  initial: float
  milestones: tuple[int, ...]
  factor: float = 0.1

  def __post_init__(self):
    if not self.initial >= 0:
      raise ValueError(f'initial value must be >= 0, got {self.initial}')
    if not 0 < self.factor <= 1:
      raise ValueError(f'step factor must be in (0, 1], got {self.factor}')
    m = list(self.milestones)
    if not m or any(int(x) != x or x < 1 for x in m) or m != sorted(set(m)):
      raise ValueError(f'milestones must be increasing rounds >= 1, got {self.milestones}')

  @property
  def constant(self) -> bool:
    return False

  def __call__(self, t: Round):
    if isinstance(t, (tf.Tensor, tf.Variable)):
      passed = tf.reduce_sum(tf.cast(
          tf.cast(t, tf.int64) >= tf.constant(self.milestones, tf.int64), tf.float64))
      return tf.cast(self.initial * tf.pow(tf.constant(self.factor, tf.float64), passed),
                     tf.float32)
    return float(self.initial * self.factor ** sum(int(t) >= m for m in self.milestones))


@dataclasses.dataclass(frozen=True)
class LocalSteps:
  """K_t = max(1, ceil(K_0 * d_K**t)) local steps in round t (`tolerant_ceil`)."""

  initial: int
  decay: float = 1.0

  def __post_init__(self):
    if int(self.initial) != self.initial or self.initial < 1:
      raise ValueError(f'local steps must be an integer >= 1, got {self.initial}')
    if not 0 < self.decay <= 1:
      raise ValueError(f'decay must be in (0, 1], got {self.decay}')

  @classmethod
  def of_tensors(cls, initial: tf.Tensor, decay: tf.Tensor) -> 'LocalSteps':
    return _of_tensors(cls, initial, decay)

  def __call__(self, t: Round):
    if isinstance(t, (tf.Tensor, tf.Variable)):
      value = tolerant_ceil(self.initial * tf.pow(
          tf.convert_to_tensor(self.decay, tf.float64), tf.cast(t, tf.float64)))
      return tf.maximum(tf.cast(value, tf.int32), 1)
    return max(1, int(tolerant_ceil(self.initial * np.float64(self.decay) ** int(t))))

  def total(self, rounds: int) -> int:
    """Sum_t K_t over rounds 0..rounds-1 (client steps per cohort slot)."""
    t = np.arange(rounds, dtype=np.float64)
    return int(np.maximum(1, tolerant_ceil(self.initial * np.power(self.decay, t))).sum())
