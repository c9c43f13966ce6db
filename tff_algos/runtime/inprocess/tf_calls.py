"""Calling and tracing TensorFlow concrete functions with little overhead."""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context as eager_context


def call_flat(concrete, flat, captured=None):
  """`concrete(*flat)` for flat tensors in signature order.

  Skips the structured-signature binding of `ConcreteFunction.__call__`: ~0.2 ms
  a call, all of a tiny call; and for pruned imported graphs (whose structured
  signature is empty) that binding fails and formats every argument's values
  into the error message before falling back to this, ~8 ms a call with a
  CNN's weights (measured: a quarter of a host-datasets EMNIST CNN round).
  """
  return concrete._call_flat(  # pylint: disable=protected-access
      list(flat), concrete.captured_inputs if captured is None else captured)


# A thread's serialized ConfigProto -> the same options with Grappler off.
_OPTIONS_WITHOUT_GRAPPLER: dict = {}


def options_without_grappler(
    options: eager_context.FunctionCallOptions) -> eager_context.FunctionCallOptions:
  """`options` with Grappler's meta optimizer disabled (one object per options)."""
  without = _OPTIONS_WITHOUT_GRAPPLER.get(options.config_proto_serialized)
  if without is None:
    config = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    without = eager_context.FunctionCallOptions(executor_type=options.executor_type,
                                                config_proto=config)
    _OPTIONS_WITHOUT_GRAPPLER[options.config_proto_serialized] = without
  return without


def call_without_grappler(concrete, flat, captured=None):
  """`call_flat` of a function whose ops are mostly calls of other functions
  (a traced round, a batch of clients), with Grappler off for that function.

  Each called function (a client's training, say) is still optimised by
  Grappler when it is instantiated: its call op carries the options it was
  traced under. On the calling graph itself Grappler changed nothing (0 nodes
  in every pass, EMNIST CNN FedAvg) and took ~0.25 s of its first call, walking
  the round's whole function library (docs/performance.md). The thread's
  options are restored afterwards, also when the call fails.
  """
  ctx = eager_context.context()
  options = ctx.function_call_options
  ctx.function_call_options = options_without_grappler(options)
  try:
    return call_flat(concrete, flat, captured)
  finally:
    ctx.function_call_options = options


def noinline_function(pruned, signature) -> Optional[tf.types.experimental.ConcreteFunction]:
  """`pruned` as a function that TensorFlow will not inline into its callers;
  None where TensorFlow cannot trace a call of it.

  Several calls of one imported computation share its variables, so they must
  run one after the other. Control edges between inlined calls do not ensure
  that (inlined bodies' variable ops have no inputs to wait on: measured, calls
  interleaved and skipped their initialisation); a call op that is kept runs
  its whole body between its inputs and its outputs.

  Tracing a call of some imported graphs fails in TensorFlow's shape inference
  of their v1 loops ("Missing src context"); such graphs are called eagerly.
  """
  try:
    return tf.function(lambda *args: call_flat(pruned, args), autograph=False,
                       experimental_attributes={'_noinline': True}
                       ).get_concrete_function(*signature)
  except tf.errors.InternalError:
    return None


def trace_unordered(body: Callable, signature: list):
  """`body` traced into a function whose ops run in data and control-edge order only.

  `tf.function` adds automatic control dependencies that run stateful ops in
  program order. Calls of imported graphs are stateful (their variables live
  inside), so under `tf.function` every call of a round would run after the
  previous one, whatever their slots. Calls that must be ordered, the same
  import's, carry explicit control edges (`TensorFlowFunction`); all else is
  data flow.
  """
  return tf.compat.v1.wrap_function(body, signature)
