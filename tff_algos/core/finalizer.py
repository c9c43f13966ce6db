"""TFF's `build_apply_optimizer_finalizer`, traced without AutoGraph.

The server step of every FedAvg/FedOpt-composed algorithm: one step of a
`tff.learning.optimizers.Optimizer` on the server model, and the step rejected
(optimizer state and weights kept) when `should_reject_update` says so (by
default: the update holds a NaN or Inf). Same types, same state, same
measurements (`update_non_finite`) and same `get_hparams`/`set_hparams` as
`tff.learning.templates.build_apply_optimizer_finalizer`, and the same results
bit for bit (tests/test_fedopt.py).

Why not TFF's own: its step is a `tf.function` with a Python `if` on a tensor,
so AutoGraph converts the optimiser's `next` and TFF's finiteness check at every
build: ~0.3 s of a trainer run's 0.8-0.9 s build on the quadratic toy, more
with an optimiser module AutoGraph has not seen yet in the process (Adam: 0.36
s). Here the rejection is a `tf.cond`; an optimiser whose `next` needs AutoGraph
(Python control flow on tensors) is traced again with it.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional, Union

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import apply_optimizer_finalizer as _tff_finalizer

Measurements = collections.OrderedDict
RejectFn = Callable[[Any, Any], tuple[Union[bool, tf.Tensor], Optional[Measurements]]]

# TFF's default rejection: the update holds a NaN or Inf.
reject_non_finite_update = _tff_finalizer.reject_non_finite_update


def _step(optimizer: tff.learning.optimizers.Optimizer, should_reject_update: RejectFn):
  def step(optimizer_state, trainable_weights, update):
    new_state, new_weights = optimizer.next(optimizer_state, trainable_weights, update)
    should_reject, measurements = should_reject_update(new_state, update)
    rejected = (optimizer_state, trainable_weights, measurements)
    applied = (new_state, new_weights, measurements)
    if not tf.is_tensor(should_reject):  # a Python value: its truth, as AutoGraph's `if`
      return rejected if should_reject else applied
    if should_reject.dtype != tf.bool or should_reject.shape.rank != 0:
      raise ValueError('should_reject_update must give a bool or a scalar tf.bool, got '
                       f'{should_reject.dtype.name}{should_reject.shape}')
    return tf.cond(should_reject, lambda: rejected, lambda: applied)
  return step


def build_apply_optimizer_finalizer(
    optimizer: tff.learning.optimizers.Optimizer,
    model_weights_type: tff.Type,
    should_reject_update: RejectFn = reject_non_finite_update,
) -> tff.learning.templates.FinalizerProcess:
  """`tff.learning.templates.build_apply_optimizer_finalizer(optimizer,
  model_weights_type, should_reject_update)`, without AutoGraph (see the module
  docstring)."""
  if (not isinstance(model_weights_type, tff.StructWithPythonType)
      or model_weights_type.python_container is not tff.learning.models.ModelWeights):
    raise TypeError('model_weights_type must be a tff.StructType of '
                    f'tff.learning.models.ModelWeights, got {model_weights_type}')
  trainable_type = model_weights_type.trainable

  @tff.tensorflow.computation
  def init_tf():
    return optimizer.initialize(tff.types.type_to_tf_tensor_specs(trainable_type))

  state_type = init_tf.type_signature.result
  step = _step(optimizer, should_reject_update)
  try:
    next_tf = tff.tensorflow.computation(
        tf.function(step, autograph=False), state_type, trainable_type, trainable_type)
  except Exception as e:  # pylint: disable=broad-except
    logging.info('%s.next traced with AutoGraph (%s)', type(optimizer).__name__, e)
    next_tf = tff.tensorflow.computation(
        tf.function(step), state_type, trainable_type, trainable_type)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_tf, tff.SERVER)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(model_weights_type, tff.SERVER),
                             tff.FederatedType(trainable_type, tff.SERVER))
  def next_fn(state, weights, update):
    new_state, trainable, measurements = tff.federated_map(
        next_tf, (state, weights.trainable, update))
    new_weights = tff.federated_zip(
        tff.learning.models.ModelWeights(trainable, weights.non_trainable))
    return tff.templates.MeasuredProcessOutput(new_state, new_weights, measurements)

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return optimizer.get_hparams(state)

  @tff.tensorflow.computation(state_type, get_hparams_fn.type_signature.result)
  def set_hparams_fn(state, hparams):
    return optimizer.set_hparams(state, hparams)

  return tff.learning.templates.FinalizerProcess(
      init_fn, next_fn, get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn)
