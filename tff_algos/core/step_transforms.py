"""Transforms of the local step's gradient, chained like optax's.

A `StepTransform` is (init, update) with a state of its own; `chain` applies
transforms in order; `correction` makes one of a stateless
`correction_fn(weights, grads)`. `clip_then_decay` and `regularized` are
paper 003's reference-code regularisation of the local gradient: clipped to a
global norm, then weight decay added. The client loop (`core.local_training`)
runs them at every local step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf

from tff_algos.core import lanes

CorrectionFn = Callable[[Any, Any], Any]


def check_regularization(weight_decay: float, clip_norm: Optional[float]) -> None:
  if not weight_decay >= 0:
    raise ValueError(f'weight decay must be >= 0, got {weight_decay}')
  if clip_norm is not None and not clip_norm > 0:
    raise ValueError(f'clip_norm must be > 0 (or unset), got {clip_norm}')


def clip_then_decay(grads, weights, clip_norm: Optional[float], weight_decay):
  """clip_by_global_norm(grads, clip_norm) + weight_decay * weights.

  The order of paper 003's reference code (PyTorch: the objective's gradient is
  clipped, then `SGD(weight_decay=...)` adds the decay term), shared by its
  FedAvg, FedProx, SCAFFOLD and FedDyn runs. A `lanes.Lanes` clip_norm clips
  each lane of a stacked model on its own (`lanes.clip_by_lane_norm`).
  """
  grads = list(grads)
  if lanes.is_lanes(clip_norm):  # a stacked model: each lane clipped on its own
    grads = lanes.clip_by_lane_norm(grads, clip_norm)
  elif clip_norm is not None:
    grads, _ = tf.clip_by_global_norm(grads, clip_norm)
  if not (isinstance(weight_decay, (int, float)) and weight_decay == 0):  # may be a tensor
    grads = [g + weight_decay * w for g, w in zip(grads, weights)]
  return grads


def regularized(correction: Optional[Callable[[Any], CorrectionFn]],
                weight_decay: float = 0.0, clip_norm: Optional[float] = None,
                ) -> Optional[Callable[[Any], CorrectionFn]]:
  """A client work's `correction` (x_t -> correction_fn), then `clip_then_decay`.

  Returns `correction` itself when there is nothing to add, so default runs
  trace the same graph as before.
  """
  check_regularization(weight_decay, clip_norm)
  if not weight_decay and clip_norm is None:
    return correction

  def with_regularization(initial_weights):
    inner = None if correction is None else correction(initial_weights)

    def correction_fn(weights, grads):
      grads = grads if inner is None else inner(weights, grads)
      return clip_then_decay(grads, weights, clip_norm, weight_decay)
    return correction_fn
  return with_regularization


class StepTransform(NamedTuple):
  """A transform of each local step's gradient, with a state of its own.

  init(trainable_variables) -> state;
  update(grads, weights, state, step) -> (grads, state), `step` the 0-based
  step index (int32). Compose with `chain`.
  """
  init: Callable[[Any], Any]
  update: Callable[[Any, Any, Any, tf.Tensor], tuple[Any, Any]]


def correction(correction_fn: CorrectionFn) -> StepTransform:
  """A stateless transform: grads <- correction_fn(weights, grads)."""
  def update(grads, weights, state, step):
    del step
    return tuple(correction_fn(weights, grads)), state
  return StepTransform(lambda trainable: (), update)


def chain(*transforms: Optional[StepTransform]) -> Optional[StepTransform]:
  """The transforms applied in order, each to the previous one's gradient
  (None entries skipped; None when none is left)."""
  transforms = tuple(t for t in transforms if t is not None)
  if not transforms:
    return None
  if len(transforms) == 1:
    return transforms[0]

  def init(trainable):
    return tuple(t.init(trainable) for t in transforms)

  def update(grads, weights, states, step):
    new_states = []
    for transform, state in zip(transforms, states):
      grads, state = transform.update(grads, weights, state, step)
      new_states.append(state)
    return grads, tuple(new_states)
  return StepTransform(init, update)
