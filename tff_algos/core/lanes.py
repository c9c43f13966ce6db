"""Many runs of one algorithm as one computation: lanes of a stacked model.

A stacked model holds C independent copies ("lanes") of a model, each of its
variables carrying the lane index as its leading axis, and its loss is the SUM
of the lanes' losses, so the gradient of lane c's slice is lane c's own
gradient. A hyperparameter given as `Lanes` (one value per lane, shaped
[C, 1, 1] to broadcast against rank-3 stacked variables) then makes every
element-wise update rule of an algorithm act on each lane with its own value:
the algorithm builders are used unchanged (`FedDynConfig(alpha=Lanes(...))`,
`OptimizerSpec('sgd', Lanes(...))`, ...), so the update rules stay where they
are written, and C runs share one build, one trace and one loop of local steps.

A condition on a `Lanes` value (the builders' argument checks, e.g.
`alpha > 0`) holds when it holds in every lane. The one operation that is not
element-wise in the local step, global-norm gradient clipping, is done per
lane by `clip_by_lane_norm` when the clipping norm is given as `Lanes`
(`step_transforms.clip_then_decay`).

Lanes stay independent as long as every lane stays finite: a client whose
update is non-finite in ANY lane is dropped in all of them (the algorithms'
NaN rule), so a grid must check that no client was dropped.
"""

from __future__ import annotations

import operator
from typing import Sequence

import numpy as np
import tensorflow as tf

LANE_RANK = 3  # stacked variables are [C, rows, cols]


def _all(op):
  def compare(self, other):
    return bool(np.all(op(np.asarray(self), np.asarray(other))))
  return compare


class Lanes(np.ndarray):
  """One float32 value per lane, shaped [C, 1, 1]; comparisons hold in all lanes."""

  def __new__(cls, values: Sequence[float]):
    flat = np.asarray(values, np.float32).reshape(-1)
    if flat.size < 1:
      raise ValueError('Lanes needs at least one value')
    return flat.reshape(-1, 1, 1).view(cls)

  __gt__ = _all(operator.gt)
  __ge__ = _all(operator.ge)
  __lt__ = _all(operator.lt)
  __le__ = _all(operator.le)
  __eq__ = _all(operator.eq)
  __ne__ = lambda self, other: not _all(operator.eq)(self, other)  # noqa: E731
  __hash__ = None

  def __bool__(self):
    return bool(np.all(np.asarray(self)))

  @property
  def values(self) -> list[float]:
    return [float(v) for v in np.asarray(self).reshape(-1)]


def is_lanes(value) -> bool:
  return isinstance(value, Lanes)


def clip_by_lane_norm(grads, clip_norm: Lanes):
  """Each lane's slice of `grads` ([C, ., .] each) clipped to that lane's global
  norm, as `tf.clip_by_global_norm` clips the lane's own run (a non-finite lane
  becomes NaN there too)."""
  squares = tf.add_n([tf.reduce_sum(tf.square(g), axis=[1, 2], keepdims=True)
                      for g in grads])                                   # [C, 1, 1]
  limit = tf.constant(np.asarray(clip_norm), tf.float32)
  scale = tf.minimum(1.0, limit * tf.math.rsqrt(squares))
  return [g * scale for g in grads]


def lane_slice(arrays: Sequence[np.ndarray], lane: int) -> list[np.ndarray]:
  """Lane `lane` of stacked arrays ([C, ...] each), leading axis dropped."""
  return [np.asarray(a)[lane] for a in arrays]
