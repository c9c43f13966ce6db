"""A TFF TensorFlow computation, imported, and called once or on many clients."""

from __future__ import annotations

from typing import Callable
import weakref

from absl import logging
import tensorflow as tf
from tensorflow_federated.proto.v0 import computation_pb2 as pb
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_algos.runtime.inprocess import graph_import
from tff_algos.runtime.inprocess import tf_calls

MAX_BATCH = 16  # clients per TensorFlow call when calls are not traced as a whole
NO_SLOT = (None, 0)  # the default device and the first import


def takes_datasets(type_signature: computation_types.FunctionType) -> bool:
  return type_signature.parameter is not None and type_analysis.contains(
      type_signature.parameter, lambda t: isinstance(t, computation_types.SequenceType))


def flatten(value, type_spec, out: list):
  """Appends the leaves of `value` in TFF binding order (tensors, variants)."""
  if isinstance(type_spec, computation_types.StructType):
    for i in range(len(type_spec)):
      flatten(value[i], type_spec[i], out)
  elif isinstance(type_spec, computation_types.SequenceType):
    out.append(value._variant_tensor)  # pylint: disable=protected-access
  else:
    out.append(value)


def _assemble(outputs, type_spec):
  """A value of `type_spec` from an iterator over its flat tensors."""
  if isinstance(type_spec, computation_types.StructType):
    return structure.Struct([(name, _assemble(outputs, t))
                             for name, t in structure.iter_elements(type_spec)])
  if isinstance(type_spec, computation_types.SequenceType):
    return tf.data.experimental.from_variant(
        next(outputs), type_conversions.type_to_tf_structure(type_spec.element))
  return next(outputs)


def _to_tensors(values: list, dtypes: list) -> list:
  """`values` as tensors of `dtypes` (tensors are passed through)."""
  return [v if isinstance(v, tf.Tensor) else tf.convert_to_tensor(v, dtype=d)
          for v, d in zip(values, dtypes)]


def _serialized_dataset(variant: tf.Tensor) -> tf.Tensor:
  """A dataset's graph, as TFF serialises datasets for its C++ worker."""
  return tf.raw_ops.DatasetToGraphV2(input_dataset=variant)


def slot_of(slots: tuple, k: int) -> tuple:
  """Client k's (device, lane): slots[k mod #slots]; `NO_SLOT` without slots."""
  return slots[k % len(slots)] if slots else NO_SLOT


def batches(n: int):
  """(start, size) covering range(n): batches of `MAX_BATCH`, then the rest in one.

  At most `MAX_BATCH` distinct sizes (so traced batch functions), whatever the cohorts.
  """
  start = 0
  while start < n:
    size = min(MAX_BATCH, n - start)
    yield start, size
    start += size


class TensorFlowFunction:
  """A TFF TensorFlow computation imported into this process's TensorFlow.

  `__call__` runs it once, `map` (federated_map over clients) and `fold`
  (federated_aggregate's accumulate) on many arguments. While a whole call is
  traced (`tracing.WholeCallTracer`), each adds call ops to that graph.
  Otherwise (eagerly) `map` and `fold` make one TensorFlow call per batch of up
  to `MAX_BATCH` clients: one call per client cost ~0.3 ms of dispatch each,
  most of a round when models are small.

  Calls of one import share its variables, so they run one after the other
  (each after the previous call and its own initialisation have finished).
  `map` spreads clients over slots (device, lane): a lane is an import of its
  own (`imports`, imported on first use), so clients on different slots run
  concurrently, as TFF's C++ runtime runs them.
  """

  def __init__(self, proto: pb.Computation, type_signature: computation_types.FunctionType,
               host_datasets: bool = False):
    self._tf_proto = proto.tensorflow
    self._parameter_type = type_signature.parameter
    self._result_type = type_signature.result
    self.host_datasets = host_datasets  # then called call by call, by design
    self.takes_datasets = takes_datasets(type_signature)
    # Seeded stateful random ops (e.g. `Dropout(rate, seed=...)`) continue one
    # stream per import across calls: with lanes, clients would draw other
    # numbers. Such client training gets one lane per device (only computations
    # taking datasets get lanes). (Unseeded ones, as
    # Keras Dropout in TFF's graphs even after `set_random_seed`, draw fresh
    # numbers per kernel whatever the lanes.)
    # Scanned for every computation: `graph_import.seeded_random_imported`.
    self.seeded_random = (graph_import.seeded_random_results(self._tf_proto)
                          and self.takes_datasets)
    first = graph_import.GraphImport(self._tf_proto, host_datasets)
    self.imports = [first]  # one per lane
    self._serialized, self._dtypes, self._token = first.serialized, first.dtypes, first.token
    self._signature, self._num_outputs = first.signature, first.num_outputs
    self.traceable = first.traceable
    self._batch_functions: dict = {}  # ('map', size, slots) or ('fold', size) -> function
    # The graph being traced, and per lane the op its next call must wait for.
    self._traced_graph, self._last_traced_call = None, {}

  def _lane(self, lane: int) -> graph_import.GraphImport:
    while len(self.imports) <= lane:
      with tf.init_scope():  # imported eagerly, also when met while tracing
        self.imports.append(graph_import.GraphImport(self._tf_proto, self.host_datasets))
    return self.imports[lane]

  # -- arguments and results

  def _flat_arguments(self, arg) -> list:
    flat = []
    if self._parameter_type is not None:
      flatten(arg, self._parameter_type, flat)
      flat = [_serialized_dataset(v) if serialized else v
              for v, serialized in zip(flat, self._serialized)]
      flat = _to_tensors(flat, self._dtypes)
    if self._token is not None:
      flat.append(self._token)
    return flat

  def _result(self, outputs):
    return _assemble(iter(outputs), self._result_type)

  # -- calls added to a graph being built

  def _call_in_graph(self, flat, deps, lane: int = 0):
    """Adds init (if any) then the computation, on import `lane`, after the ops `deps`.

    Returns its outputs and the op a later call must wait for (the call itself:
    the imports' functions are kept as call ops, which finish only when all
    their side effects have).
    """
    imported = self._lane(lane)
    with tf.control_dependencies(deps):
      if imported.initialize is not None:
        done = imported.initialize(*flat[len(self._dtypes):])[-1]
        deps = [done.op]
    with tf.control_dependencies(deps):
      outputs = list(imported.compute(*flat))
    return outputs, [outputs[0].op] if outputs else deps

  def _map_body(self, size: int, slots: tuple):
    n_in = len(self._signature)

    def body(*args):
      outputs, last = [], {}
      for k in range(size):
        device, lane = slot_of(slots, k)
        with tf.device(device):  # calls on one import run in order
          out, last[lane] = self._call_in_graph(args[k * n_in:(k + 1) * n_in],
                                                last.get(lane, []), lane)
        outputs.extend(out)
      return outputs
    return body, self._signature * size

  def _fold_body(self, size: int):
    """acc <- f(acc, v_k), the accumulator being the first argument."""
    n_acc = self._num_outputs
    n_value = len(self._signature) - n_acc

    def body(*args):
      acc, values, deps = list(args[:n_acc]), args[n_acc:], []
      for k in range(size):
        acc, deps = self._call_in_graph(acc + list(values[k * n_value:(k + 1) * n_value]),
                                        deps)
      return acc
    return body, self._signature[:n_acc] + self._signature[n_acc:] * size

  # -- batches of eager calls: one TensorFlow call each where traceable

  def _map_batch(self, size: int, slots: tuple = ()):
    """The function running `size` clients' calls of a `map` (traced once per size and slots)."""
    return self._batch_function(('map', size, slots), lambda: self._map_body(size, slots),
                                lambda: self._eager_map(size, slots))

  def _fold_batch(self, size: int):
    """The function folding `size` values into the accumulator (traced once per size)."""
    return self._batch_function(('fold', size), lambda: self._fold_body(size),
                                lambda: self._eager_fold(size))

  def _batch_function(self, key: tuple, traced_body: Callable, eager: Callable):
    """The cached function for `key`: `traced_body()`'s (body, signature)
    traced, or `eager()` where this computation is not traceable."""
    fn = self._batch_functions.get(key)
    if fn is not None:
      return fn
    if not self.traceable:
      if not self._batch_functions and not self.host_datasets:  # once per computation
        logging.warning('In-process backend: a computation of type %s cannot be traced '
                        'into a function; it runs eagerly, one call per client.',
                        self._result_type)
      fn = eager()
    else:
      fn = self._traced_batch(*traced_body(), eager)
    self._batch_functions[key] = fn
    return fn

  def _traced_batch(self, body, signature, eager: Callable):
    try:
      concrete = tf_calls.trace_unordered(body, signature)
    except tf.errors.InternalError as e:  # as in `tf_calls.noinline_function`
      if not self._batch_functions and not self.host_datasets:  # once per computation
        logging.warning('In-process backend: a computation of type %s cannot be traced '
                        'into a batched call (%s); it runs eagerly, one call per client.',
                        self._result_type, str(e).splitlines()[0][:200])
      return eager()
    captured = concrete.captured_inputs
    return lambda *flat: tf_calls.call_without_grappler(concrete, flat, captured)

  # What the traced batches do, as eager calls (same order, same
  # initialisation), all on the first import: eager calls run one at a time anyway.

  def _eager_call(self, flat, device=None):
    imported = self.imports[0]
    with tf.device(device):
      if imported.initialize is not None:
        tf_calls.call_flat(imported.initialize, flat[len(self._dtypes):])
      return list(tf_calls.call_flat(imported.compute, flat))

  def _eager_map(self, size: int, slots: tuple):
    n_in = len(self._signature)
    return lambda *args: [
        t for k in range(size)
        for t in self._eager_call(args[k * n_in:(k + 1) * n_in], slot_of(slots, k)[0])]

  def _eager_fold(self, size: int):
    n_acc = self._num_outputs
    n_value = len(self._signature) - n_acc

    def fold(*args):
      acc, values = list(args[:n_acc]), args[n_acc:]
      for k in range(size):
        acc = self._eager_call(acc + list(values[k * n_value:(k + 1) * n_value]))
      return acc
    return fold

  # -- inside a traced whole computation: a call op per call

  def _traced_call(self, flat, slot: tuple = NO_SLOT):
    """Adds one call to the graph being traced, after this import's last one.

    Calls of one import (lane) are chained by control edges (they share its
    variables), whatever their device; calls of other imports, and of other
    computations, are not, and TensorFlow may run them concurrently. Only
    `traceable` functions are met here (`tracing.WholeCallTracer` checks).
    """
    graph = tf.compat.v1.get_default_graph()
    if self._traced_graph is None or self._traced_graph() is not graph:
      self._traced_graph, self._last_traced_call = weakref.ref(graph), {}
    device, lane = slot
    with tf.device(device):
      outputs, self._last_traced_call[lane] = self._call_in_graph(
          flat, self._last_traced_call.get(lane, []), lane)
    return outputs

  # -- the interpreter's calls

  def __call__(self, arg=None):
    if not tf.executing_eagerly():
      return self._result(self._traced_call(self._flat_arguments(arg)))
    return self._result(self._map_batch(1)(*self._flat_arguments(arg)))

  def map(self, args: list, slots: tuple = ()) -> list:
    """[self(a) for a in args], in order, in few TensorFlow calls; args[k] on
    slot k mod #slots (see `slot_of`)."""
    if not tf.executing_eagerly():
      return [self._result(self._traced_call(self._flat_arguments(a), slot_of(slots, k)))
              for k, a in enumerate(args)]
    flats = [self._flat_arguments(a) for a in args]
    results, n_out = [], self._num_outputs
    for start, size in batches(len(flats)):
      rotated = slots[start % len(slots):] + slots[:start % len(slots)] if slots else ()
      outputs = self._map_batch(size, rotated)(
          *[t for flat in flats[start:start + size] for t in flat])
      results.extend(self._result(outputs[k * n_out:(k + 1) * n_out]) for k in range(size))
    return results

  def fold(self, acc, values: list):
    """acc <- self(<acc, v>) for v in values, in order (federated_aggregate)."""
    acc_type = self._parameter_type[0]
    flat_acc = []
    flatten(acc, acc_type, flat_acc)
    n_acc = len(flat_acc)
    if (n_acc != self._num_outputs or self._token is not None or self.host_datasets
        or not tf.executing_eagerly()):
      for v in values:  # traced, or not a plain accumulator: one call each
        acc = self(structure.Struct([(None, acc), (None, v)]))
      return acc
    flat_acc = _to_tensors(flat_acc, self._dtypes)
    value_type, value_dtypes = self._parameter_type[1], self._dtypes[n_acc:]
    flats = []
    for v in values:
      flat = []
      flatten(v, value_type, flat)
      flats.append(_to_tensors(flat, value_dtypes))
    for start, size in batches(len(flats)):
      flat_acc = list(self._fold_batch(size)(
          *flat_acc, *[t for flat in flats[start:start + size] for t in flat]))
    return self._result(flat_acc)
