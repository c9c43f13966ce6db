"""An in-process TFF backend: compiled computations run in this process's TF.

TFF 0.87's pip `worker_binary` embeds its own CPU-only TensorFlow. This
backend instead executes a federated computation in the Python process, so its
TensorFlow work runs on whatever devices the Python TensorFlow sees (GPUs
included), with no worker process, no gRPC and no (de)serialisation of values
or datasets per round.

It is a TFF executor (`executor_base.Executor`) plugged into TFF's own
`SyncExecutionContext`. It receives the call-dominant building-block tree that
TFF's native compiler gives the C++ worker, minus that compiler's static
rewrites of the TensorFlow graphs (`compile_for_inprocess`), and interprets it:

* TensorFlow computations (`CompiledComputation`) are imported once into a
  `tf.compat.v1.wrap_function` and pruned to a concrete function from their
  parameter tensors to their result tensors; their `initialize_op` runs before
  every call, as in the C++ worker (with it run only once, model metrics
  accumulate across clients and the reported training loss differs);
* federated values at CLIENTS are Python lists (one entry per client, in order),
  at SERVER single values; datasets are passed as their variant tensors;
* intrinsics are interpreted as in TFF's C++ `FederatingExecutor`; in
  particular `federated_aggregate` folds `accumulate` over the clients in
  order, then applies `report` (no `merge`);
* a whole call (e.g. one round of a learning process) is interpreted once,
  while a `tf.function` is traced, and is then ONE TensorFlow call per round
  (`_Traced`; traced again for a new cohort size): Python interpretation and
  per-call dispatch, not TensorFlow work, were most of a round on small models;
* computations that cannot be traced that way are interpreted call by call,
  with a `federated_map` of a TensorFlow computation, and an aggregation's
  `accumulate` fold, still run up to 16 clients per TensorFlow call.
* clients train concurrently: client k's training (a `federated_map` of a
  computation that takes datasets) runs on lane k mod `concurrent_clients`
  of its device, a lane being an import of that computation with variables of
  its own; calls of one lane are chained by control edges, and nothing else
  orders them (rounds are traced without `tf.function`'s automatic control
  dependencies, which had chained every call). Results do not depend on it.

Where the time of a round goes, and what each of these choices bought, is in
docs/performance.md.

Supported intrinsics: the ones the native compiler leaves in our learning
processes (map, apply, broadcast, zip, aggregate, value, eval) and sum/mean/
weighted mean; others (secure sums, select, min/max, sequence ops) raise a
clear `ValueError`.

With a GPU (`host_datasets`, on by default when TensorFlow sees one), the
client work runs on the GPU with its input pipeline on the host, as in TFF's
own C++ runtime: each computation that takes datasets gets the native
compiler's static Grappler pass (function inlining), its dataset, iterator and
optional ops are pinned to the CPU, each dataset is passed as its serialized
graph (a host string) and rebuilt on the CPU inside the computation, and such
computations run call by call (one eager call per client): a round whose
arguments hold datasets is then interpreted call by call (aggregation and
server update too), not traced. Without this, on an H100 with TF 2.14, a
dataset reaching a function call op on the GPU failed ("No unary variant device copy function
found ... DatasetVariantWrapper") and an iterator that TensorFlow placed on
the GPU crashed the process. Measured on the H100 (tests/test_backends.py):
the same model as the C++ worker on CPU, to 1e-5, with TF32 off. With several
visible GPUs, client k's work is placed on GPU k mod #GPUs (untested: one GPU
was lent).
"""

from __future__ import annotations

import itertools
import os
import weakref
from typing import Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context as eager_context
from tensorflow_federated.proto.v0 import computation_pb2 as pb
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.environments.tensorflow_backend import compiled_computation_transformations
from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_tree_transformations
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.compiler import building_blocks as bb
from tensorflow_federated.python.core.impl.compiler import transformations
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import executor_base
from tensorflow_federated.python.core.impl.executors import executor_value_base
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import placements
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tff_algos.runtime import context

_suffixes = itertools.count()


class _Fed:
  """A federated value: `value` is a list per client unless `all_equal`."""
  __slots__ = ('placement', 'all_equal', 'value')

  def __init__(self, placement, value, all_equal):
    self.placement, self.value, self.all_equal = placement, value, all_equal

  def members(self, num_clients: int) -> list:
    return [self.value] * num_clients if self.all_equal else self.value


# ---------------------------------------------------------------- TensorFlow --


class _Import:
  """One import of a TFF TensorFlow computation's graph, with variables of its own.

  `pruned` runs the computation (its parameter tensors and the session token
  in, its result tensors out) and `pruned_init` its `initialize_op`: `_strict`
  functions that calls can be traced into, or, where that fails
  (`batchable` False) or with `host_datasets`, the pruned functions themselves,
  called eagerly.
  """

  def __init__(self, tf_proto, host_datasets: bool):
    graph_def = serialization_utils.unpack_graph_def(tf_proto.graph_def)
    # Resources (variables) of different imports must not share names.
    suffix = f'inprocess{next(_suffixes)}'
    graph_def = tensorflow_utils._uniquify_shared_names_with_suffix(  # pylint: disable=protected-access
        graph_def, suffix)
    # Function names are global in the eager context: equal names of different
    # graphs (e.g. `__inference_..._155`) must not clash.
    _rename_functions(graph_def, suffix)
    if host_datasets:
      _pin_input_pipeline_to_cpu(graph_def)
    param_names = (tensorflow_utils.extract_tensor_names_from_binding(tf_proto.parameter)
                   if tf_proto.HasField('parameter') else [])
    # With `host_datasets`, a dataset parameter is fed its serialized graph (a
    # host string) and rebuilt on the CPU inside this graph.
    variants = {n.name for n in graph_def.node
                if n.op == 'Placeholder' and n.attr['dtype'].type == tf.variant.as_datatype_enum}
    self.serialized = ([n.split(':')[0] in variants for n in param_names]
                       if host_datasets else [False] * len(param_names))
    strings = {}

    def import_graph():
      input_map = {}
      for k, name in enumerate(param_names):
        if self.serialized[k]:
          # Under a scope of this import's own: no clash with imported names.
          with tf.device('/device:CPU:0'), tf.name_scope(f'{suffix}_dataset_{k}'):
            strings[k] = tf.compat.v1.placeholder(tf.string, [], name='serialized')
            input_map[name] = tf.raw_ops.DatasetFromGraph(graph_def=strings[k])
      tf.compat.v1.import_graph_def(graph_def, input_map=input_map, name='')

    wrapped = tf.compat.v1.wrap_function(import_graph, [])
    graph = wrapped.graph
    feeds = [strings[k] if k in strings else graph.as_graph_element(n)
             for k, n in enumerate(param_names)]
    self.dtypes = [t.dtype for t in feeds]
    self.token = None
    if tf_proto.session_token_tensor_name:
      token = graph.as_graph_element(tf_proto.session_token_tensor_name)
      if token.consumers():
        feeds.append(token)
        self.token = tf.constant('inprocess')
    self.signature = [tf.TensorSpec(t.shape, t.dtype) for t in feeds]
    result_names = tensorflow_utils.extract_tensor_names_from_binding(tf_proto.result)
    pruned = wrapped.prune(feeds, [graph.as_graph_element(n) for n in result_names])
    # With host datasets, never traced into other functions: no `_strict` wrappers.
    strict = (lambda fn, signature: None) if host_datasets else _strict
    self.pruned = strict(pruned, self.signature)
    self.num_outputs = len(result_names)
    self.pruned_init = pruned_init = None
    if tf_proto.initialize_op:
      init_op = graph.as_graph_element(tf_proto.initialize_op)
      with graph.as_default(), tf.control_dependencies([init_op]):
        done = tf.constant(True)  # a tensor to order the call after
      pruned_init = wrapped.prune(feeds[len(param_names):], [init_op, done])
      self.pruned_init = strict(pruned_init, self.signature[len(param_names):])
    # Graphs that cannot (or must not) be traced into other functions run
    # call by call.
    self.batchable = self.pruned is not None and (
        pruned_init is None or self.pruned_init is not None)
    if not self.batchable:
      self.pruned, self.pruned_init = pruned, pruned_init


class _TensorFlowFunction:
  """A TFF TensorFlow computation imported into this process's TensorFlow.

  `__call__` runs it once, `map` (federated_map over clients) and `fold`
  (federated_aggregate's accumulate) on many arguments. While a whole call is
  traced (`_Traced`), each adds call ops to that graph. Otherwise (eagerly)
  `map` and `fold` make one TensorFlow call per chunk of up to `_MAX_CHUNK`
  clients: one call per client cost ~0.3 ms of dispatch each, most of a round
  when models are small.

  Calls of one import share its variables, so they run one after the other
  (each after the previous call and its own initialisation have finished).
  `map` spreads clients over slots (device, lane): a lane is an import of its
  own (imported on first use), so clients on different slots run
  concurrently, as TFF's C++ runtime runs them.
  """

  def __init__(self, proto: pb.Computation, type_signature: computation_types.FunctionType,
               host_datasets: bool = False):
    self._tf_proto = proto.tensorflow
    self._parameter_type = type_signature.parameter
    self._result_type = type_signature.result
    self._host_datasets = host_datasets  # then called call by call, by design
    self.takes_datasets = _takes_datasets(type_signature)
    # Seeded stateful random ops (e.g. `Dropout(rate, seed=...)`) continue one
    # stream per import across calls: with lanes, clients would draw other
    # numbers. Such client training gets one lane per device (only computations
    # taking datasets get lanes, so only theirs are scanned). (Unseeded ones, as
    # Keras Dropout in TFF's graphs even after `set_random_seed`, draw fresh
    # numbers per kernel whatever the lanes.)
    self.seeded_random = self.takes_datasets and _has_seeded_random_results(self._tf_proto)
    first = _Import(self._tf_proto, host_datasets)
    self._imports = [first]
    self._serialized, self._dtypes, self._token = first.serialized, first.dtypes, first.token
    self._signature, self._num_outputs = first.signature, first.num_outputs
    self._batchable = first.batchable
    self._chunks: dict = {}
    self._graph, self._graph_deps = None, {}  # calls traced so far into one graph

  def _lane(self, lane: int) -> _Import:
    while len(self._imports) <= lane:
      with tf.init_scope():  # imported eagerly, also when met while tracing
        self._imports.append(_Import(self._tf_proto, self._host_datasets))
    return self._imports[lane]

  # -- arguments and results

  def _flat(self, arg) -> list:
    flat = []
    if self._parameter_type is not None:
      _flatten(arg, self._parameter_type, flat)
      flat = [_serialized_dataset(v) if serialized else v
              for v, serialized in zip(flat, self._serialized)]
      flat = _tensors(flat, self._dtypes)
    if self._token is not None:
      flat.append(self._token)
    return flat

  def _result(self, outputs):
    return _assemble(iter(outputs), self._result_type)

  # -- one chunk of calls, traced once per (kind, size, slots)

  def _call_in_graph(self, flat, deps, lane: int = 0):
    """Traces init (if any) then the computation, on import `lane`, after the ops `deps`.

    Returns its outputs and the op a later call must wait for (the call itself:
    `_strict` calls finish only when all their side effects have).
    """
    imported = self._lane(lane)
    with tf.control_dependencies(deps):
      if imported.pruned_init is not None:
        done = imported.pruned_init(*flat[len(self._dtypes):])[-1]
        deps = [done.op]
    with tf.control_dependencies(deps):
      outputs = list(imported.pruned(*flat))
    return outputs, [outputs[0].op] if outputs else deps

  def _chunk(self, kind: str, size: int, slots: tuple = ()):
    key = (kind, size, slots)
    fn = self._chunks.get(key)
    if fn is not None:
      return fn
    n_in, n_out = len(self._signature), self._num_outputs

    if kind == 'map':
      def body(*args):
        outputs, last = [], {}
        for k in range(size):
          slot = _slot(slots, k)
          with tf.device(slot[0]):  # calls on one import run in order
            out, last[slot[1]] = self._call_in_graph(args[k * n_in:(k + 1) * n_in],
                                                     last.get(slot[1], []), slot[1])
          outputs.extend(out)
        return outputs
      signature = self._signature * size
    else:  # fold: acc <- f(acc, v_k), the accumulator being the first argument
      n_acc = n_out
      def body(*args):
        acc, values = list(args[:n_acc]), args[n_acc:]
        n_v = n_in - n_acc
        deps = []
        for k in range(size):
          acc, deps = self._call_in_graph(acc + list(values[k * n_v:(k + 1) * n_v]), deps)
        return acc
      signature = self._signature[:n_out] + self._signature[n_out:] * size
    try:
      if not self._batchable:
        raise tf.errors.InternalError(None, None, 'not traceable')
      concrete = _trace_unordered(body, signature)
    except tf.errors.InternalError as e:  # see `_strict`: the same, one level up
      if not self._chunks and not self._host_datasets:  # once per computation
        logging.warning('In-process backend: a computation of type %s cannot be traced '
                        'into a batched call (%s); it runs eagerly, one call per client.',
                        self._result_type, str(e).splitlines()[0][:200])
      fn = self._chunks[key] = self._eager_chunk(kind, size, slots)
      return fn
    captured = concrete.captured_inputs

    def fn(*flat):
      return _call_calls(concrete, flat, captured)

    self._chunks[key] = fn
    return fn

  def _eager_chunk(self, kind: str, size: int, slots: tuple = ()):
    """What `_chunk` traces, as eager calls (same order, same initialisation),
    all on the first import: eager calls run one at a time anyway."""
    n_in, n_out = len(self._signature), self._num_outputs
    imported = self._imports[0]

    def call(flat, device=None):
      with tf.device(device):
        if imported.pruned_init is not None:
          _call_flat(imported.pruned_init, flat[len(self._dtypes):])
        return list(_call_flat(imported.pruned, flat))

    if kind == 'map':
      return lambda *args: [
          t for k in range(size)
          for t in call(args[k * n_in:(k + 1) * n_in], _slot(slots, k)[0])]

    def fold(*args):
      acc, values, n_v = list(args[:n_out]), args[n_out:], n_in - n_out
      for k in range(size):
        acc = call(acc + list(values[k * n_v:(k + 1) * n_v]))
      return acc
    return fold

  # -- inside a traced whole computation (`_Traced`): a call op per call

  def _traced_call(self, flat, slot: tuple = (None, 0)):
    """Adds one call to the graph being traced, after this import's last one.

    Calls of one import (lane) are chained by control edges (they share its
    variables, see `_strict`), whatever their device; calls of other imports,
    and of other computations, are not, and TensorFlow may run them
    concurrently.
    """
    if not self._batchable:
      raise _NotTraceable('a TensorFlow computation cannot be traced into a function '
                          '(or takes datasets, which run call by call with a GPU)')
    graph = tf.compat.v1.get_default_graph()
    if self._graph is None or self._graph() is not graph:
      self._graph, self._graph_deps = weakref.ref(graph), {}
    with tf.device(slot[0]):
      outputs, self._graph_deps[slot[1]] = self._call_in_graph(
          flat, self._graph_deps.get(slot[1], []), slot[1])
    return outputs

  def __call__(self, arg=None):
    if not tf.executing_eagerly():
      return self._result(self._traced_call(self._flat(arg)))
    return self._result(self._chunk('map', 1)(*self._flat(arg)))

  def map(self, args: list, slots: tuple = ()) -> list:
    """[self(a) for a in args], in order, in few TensorFlow calls; args[k] on
    slot k mod #slots (see `_slot`)."""
    if not tf.executing_eagerly():
      return [self._result(self._traced_call(self._flat(a), _slot(slots, k)))
              for k, a in enumerate(args)]
    flats = [self._flat(a) for a in args]
    results, n_out = [], self._num_outputs
    for start, size in _chunks(len(flats)):
      rotated = slots[start % len(slots):] + slots[:start % len(slots)] if slots else ()
      outputs = self._chunk('map', size, rotated)(
          *[t for flat in flats[start:start + size] for t in flat])
      results.extend(self._result(outputs[k * n_out:(k + 1) * n_out]) for k in range(size))
    return results

  def fold(self, acc, values: list):
    """acc <- self(<acc, v>) for v in values, in order (federated_aggregate)."""
    acc_type = self._parameter_type[0]
    flat_acc = []
    _flatten(acc, acc_type, flat_acc)
    n_acc = len(flat_acc)
    if (n_acc != self._num_outputs or self._token is not None or self._host_datasets
        or not tf.executing_eagerly()):
      for v in values:  # traced, or not a plain accumulator: one call each
        acc = self(structure.Struct([(None, acc), (None, v)]))
      return acc
    flat_acc = _tensors(flat_acc, self._dtypes)
    value_type, value_dtypes = self._parameter_type[1], self._dtypes[n_acc:]
    flats = []
    for v in values:
      flat = []
      _flatten(v, value_type, flat)
      flats.append(_tensors(flat, value_dtypes))
    for start, size in _chunks(len(flats)):
      flat_acc = list(self._chunk('fold', size)(
          *flat_acc, *[t for flat in flats[start:start + size] for t in flat]))
    return self._result(flat_acc)


_STATEFUL_RANDOM_OPS = frozenset([
    'RandomUniform', 'RandomUniformInt', 'RandomStandardNormal', 'TruncatedNormal',
    'ParameterizedTruncatedNormal', 'RandomShuffle', 'Multinomial', 'RandomGamma',
    'RandomPoisson', 'RandomPoissonV2', 'RandomCrop'])


def _has_seeded_random_results(tf_proto) -> bool:
  """Whether a seeded stateful random op can reach the computation's results.

  Only the ops the result tensors depend on count (the graph's own nodes, and
  every op of the functions those nodes call, transitively): the Keras
  initialisers, which only the `initialize_op` reaches, are overwritten by the
  server's weights. Unseeded ops (seed = seed2 = 0) draw fresh numbers per
  kernel anyway.
  """
  graph_def = serialization_utils.unpack_graph_def(tf_proto.graph_def)
  nodes = {n.name: n for n in graph_def.node}
  library = {f.signature.name: f for f in graph_def.library.function}
  todo = [name.split(':')[0] for name in
          tensorflow_utils.extract_tensor_names_from_binding(tf_proto.result)]
  seen, ops = set(), []
  while todo:
    node = nodes.get(todo.pop())
    if node is None or node.name in seen:
      continue
    seen.add(node.name)
    ops.append(node)
    todo.extend(i.lstrip('^').split(':')[0] for i in node.input)
  def called(node):
    for attr in node.attr.values():
      names = [attr.func.name] if attr.HasField('func') else [
          f.name for f in attr.list.func]
      yield from (n for n in names if n)
  done = set()
  functions = [f for op in ops for f in called(op)]
  while functions:
    name = functions.pop()
    if name in done or name not in library:
      continue
    done.add(name)
    for node in library[name].node_def:
      ops.append(node)
      functions.extend(called(node))
  return any(op.op in _STATEFUL_RANDOM_OPS and (op.attr['seed'].i or op.attr['seed2'].i)
             for op in ops)


def _trace_unordered(body: Callable, signature: list):
  """`body` traced into a function whose ops run in data and control-edge order only.

  `tf.function` adds automatic control dependencies that run stateful ops in
  program order. Calls of imported graphs are stateful (their variables live
  inside), so under `tf.function` every call of a round ran after the previous
  one, whatever their slots (measured: 2 lanes no faster than 1). Calls that
  must be ordered, the same import's, carry explicit control edges
  (`_call_in_graph`); all else is data flow.
  """
  return tf.compat.v1.wrap_function(body, signature)


def _slot(slots: tuple, k: int) -> tuple:
  """Client k's (device, lane): slots[k mod #slots]; (None, 0), the default
  device and first import, without slots."""
  return slots[k % len(slots)] if slots else (None, 0)


def _call_flat(concrete, flat, captured=None):
  """`concrete(*flat)` for flat tensors in signature order.

  Skips the structured-signature binding of `ConcreteFunction.__call__`: ~0.2 ms
  a call, all of a tiny call; and for pruned imported graphs (whose structured
  signature is empty) that binding fails and formats every argument's values
  into the error message before falling back to this, ~8 ms a call with a
  CNN's weights (measured: a quarter of a host-datasets EMNIST CNN round).
  """
  return concrete._call_flat(  # pylint: disable=protected-access
      list(flat), concrete.captured_inputs if captured is None else captured)


_CALLS_OPTIONS: dict = {}  # caller's serialized ConfigProto -> the same without Grappler


def _call_calls(concrete, flat, captured=None):
  """`_call_flat` of a function whose ops are mostly calls of other functions
  (a traced round, a chunk of clients), with Grappler off for that function.

  Each called function (a client's training, say) is still optimised by
  Grappler when it is instantiated: its call op carries the options it was
  traced under. On the calling graph itself Grappler changed nothing (0 nodes
  in every pass, EMNIST CNN FedAvg) and took ~0.25 s of its first call, walking
  the round's whole function library: a new algorithm's first round went from
  2.2 to 1.9 s, and later rounds are unchanged (measured, 2-core VM).
  """
  ctx = eager_context.context()
  options = ctx.function_call_options
  calls = _CALLS_OPTIONS.get(options.config_proto_serialized)
  if calls is None:
    config = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    calls = _CALLS_OPTIONS[options.config_proto_serialized] = eager_context.FunctionCallOptions(
        executor_type=options.executor_type, config_proto=config)
  ctx.function_call_options = calls
  try:
    return _call_flat(concrete, flat, captured)
  finally:
    ctx.function_call_options = options


def _strict(pruned, signature):
  """`pruned` as a function that TensorFlow will not inline into its callers.

  Several calls of one imported computation share its variables, so they must
  run one after the other. Control edges between inlined calls do not ensure
  that (inlined bodies' variable ops have no inputs to wait on: measured, calls
  interleaved and skipped their initialisation); a call op that is kept runs
  its whole body between its inputs and its outputs.
  """
  try:
    return tf.function(lambda *args: _call_flat(pruned, args), autograph=False,
                       experimental_attributes={'_noinline': True}
                       ).get_concrete_function(*signature)
  except tf.errors.InternalError:
    # Tracing a call of some imported graphs fails in TensorFlow's shape
    # inference of their v1 loops ("Missing src context", seen with a
    # LocalUpdateDecay graph after the native compiler's static Grappler pass,
    # which `compile_for_inprocess` no longer runs); such graphs are called
    # eagerly as pruned.
    return None


def _takes_datasets(type_signature: computation_types.FunctionType) -> bool:
  return type_signature.parameter is not None and type_analysis.contains(
      type_signature.parameter, lambda t: isinstance(t, computation_types.SequenceType))


def _native_grappler_config() -> tf.compat.v1.ConfigProto:
  """The static Grappler pass of TFF's native compiler (`desugar_and_transform_to_native`)."""
  config = tf.compat.v1.ConfigProto()
  rewrite = config.graph_options.rewrite_options
  aggressive = rewrite.AGGRESSIVE
  rewrite.memory_optimization = aggressive
  rewrite.constant_folding = aggressive
  rewrite.arithmetic_optimization = aggressive
  rewrite.loop_optimization = aggressive
  rewrite.function_optimization = aggressive
  return config


def _inline_function_calls(comp: bb.CompiledComputation) -> bb.CompiledComputation:
  """`comp` through TFF's native compiler's static Grappler pass.

  TFF's compiler runs it for GPUs: "The function inlining is critical for GPU
  support, otherwise variant placeholders that received datasets will be placed
  on GPUs which don't have kernels for datasets". The GPU path of this backend
  was verified with it (see the module docstring).
  """
  return compiled_computation_transformations.optimize_tensorflow_comp(
      comp, _native_grappler_config())


_MAX_CHUNK = 16


def _chunks(n: int):
  """(start, size) covering range(n): chunks of 16, then the rest in one.

  At most 16 distinct sizes (so traced chunk functions), whatever the cohorts.
  """
  start = 0
  while start < n:
    size = min(_MAX_CHUNK, n - start)
    yield start, size
    start += size


def _rename_functions(graph_def, suffix: str):
  names = {f.signature.name: f'{f.signature.name}_{suffix}'
           for f in graph_def.library.function}
  if not names:
    return

  def fix_attr(attr):
    if attr.HasField('func') and attr.func.name in names:
      attr.func.name = names[attr.func.name]
    for f in attr.list.func:
      if f.name in names:
        f.name = names[f.name]

  def fix_nodes(nodes):
    for node in nodes:
      if node.op in names:
        node.op = names[node.op]
      for attr in node.attr.values():
        fix_attr(attr)

  fix_nodes(graph_def.node)
  for f in graph_def.library.function:
    f.signature.name = names[f.signature.name]
    fix_nodes(f.node_def)
    for attr in f.attr.values():
      fix_attr(attr)
  for g in graph_def.library.gradient:
    g.function_name = names.get(g.function_name, g.function_name)
    g.gradient_func = names.get(g.gradient_func, g.gradient_func)


def _flatten(value, type_spec, out: list):
  """Appends the leaves of `value` in TFF binding order (tensors, variants)."""
  if isinstance(type_spec, computation_types.StructType):
    for i in range(len(type_spec)):
      _flatten(value[i], type_spec[i], out)
  elif isinstance(type_spec, computation_types.SequenceType):
    out.append(value._variant_tensor)  # pylint: disable=protected-access
  else:
    out.append(value)


def _is_input_pipeline_op(op: str) -> bool:
  return 'Dataset' in op or 'Iterator' in op or op.startswith('Optional')


def _pin_input_pipeline_to_cpu(graph_def) -> None:
  """Dataset, iterator and optional ops (in the graph and its functions) on the CPU.

  TFF serialises graphs without device annotations, and with a GPU TensorFlow
  2.14 placed iterators created in a tf.cond branch on the GPU, where using
  them crashed the process (segfault).
  """
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  for node in nodes:
    if _is_input_pipeline_op(node.op):
      node.device = '/device:CPU:0'


def _serialized_dataset(variant: tf.Tensor) -> tf.Tensor:
  """A dataset's graph, as TFF serialises datasets for its C++ worker."""
  return tf.raw_ops.DatasetToGraphV2(input_dataset=variant)


def _tensors(values: list, dtypes: list) -> list:
  """`values` as tensors of `dtypes` (tensors are passed through)."""
  return [v if isinstance(v, tf.Tensor) else tf.convert_to_tensor(v, dtype=d)
          for v, d in zip(values, dtypes)]


def _assemble(outputs, type_spec):
  if isinstance(type_spec, computation_types.StructType):
    return structure.Struct([(name, _assemble(outputs, t))
                             for name, t in structure.iter_elements(type_spec)])
  if isinstance(type_spec, computation_types.SequenceType):
    return tf.data.experimental.from_variant(
        next(outputs), type_conversions.type_to_tf_structure(type_spec.element))
  return next(outputs)


# ------------------------------------------------------------- interpreter --


class _Env:
  __slots__ = ('names', 'parent')

  def __init__(self, names: dict, parent: Optional['_Env']):
    self.names, self.parent = names, parent

  def lookup(self, name):
    env = self
    while env is not None:
      if name in env.names:
        return env.names[name]
      env = env.parent
    raise ValueError(f'Unbound reference {name!r}')


_UNSUPPORTED = ('federated_secure_sum', 'federated_secure_sum_bitwidth',
                'federated_secure_modular_sum', 'federated_select',
                'federated_secure_select', 'federated_min', 'federated_max',
                'sequence_map', 'sequence_reduce', 'sequence_sum')


def _map(fn, *xs):
  if isinstance(xs[0], structure.Struct):
    return structure.map_structure(fn, *xs)
  return fn(*xs)


def _add(a, b):
  return _map(tf.add, a, b)


class _Interpreter:
  """Evaluates a compiled building block for a given number of clients."""

  def __init__(self, num_clients: int, devices: list[str], tf_functions: dict,
               host_datasets: bool = False, lanes: int = 1):
    self.num_clients = num_clients
    self.devices = devices
    self.host_datasets = host_datasets
    # Client k's TensorFlow work (a federated_map of a TensorFlow computation)
    # goes to slot k mod #slots: devices[k mod #devices] when several, and on
    # each device `lanes` imports that run concurrently.
    # Only client training (computations that take datasets) gets lanes: the
    # other per-client maps are small.
    def slots(n_lanes):
      devs = devices if len(devices) > 1 else [None]
      # One import per slot: slots on different devices must not share variables.
      found = tuple((d, j * len(devs) + i) for j in range(n_lanes)
                    for i, d in enumerate(devs))
      return () if found == ((None, 0),) else found
    self._training_slots, self._client_slots = slots(lanes), slots(1)
    self.tf_functions = tf_functions  # id(CompiledComputation) -> (it, function)

  def tensorflow(self, comp: bb.CompiledComputation) -> _TensorFlowFunction:
    key = id(comp)
    entry = self.tf_functions.get(key)
    if entry is None:
      with tf.init_scope():  # imported eagerly, also when met while tracing
        if self.host_datasets and _takes_datasets(comp.type_signature):
          entry = (comp, _TensorFlowFunction(
              _inline_function_calls(comp).proto, comp.type_signature, host_datasets=True))
        else:
          entry = (comp, _TensorFlowFunction(comp.proto, comp.type_signature))
      self.tf_functions[key] = entry
    return entry[1]

  def eval(self, comp, env: Optional[_Env]):
    if isinstance(comp, bb.Reference):
      return env.lookup(comp.name)
    if isinstance(comp, bb.Call):
      fn = self.eval(comp.function, env)
      return fn() if comp.argument is None else fn(self.eval(comp.argument, env))
    if isinstance(comp, bb.Selection):
      source = self.eval(comp.source, env)
      return source[comp.as_index()]
    if isinstance(comp, bb.Struct):
      return structure.Struct([(name, self.eval(e, env))
                               for name, e in structure.iter_elements(comp)])
    if isinstance(comp, bb.Block):
      scope = _Env({}, env)
      for name, value in comp.locals:
        scope.names[name] = self.eval(value, scope)
      return self.eval(comp.result, scope)
    if isinstance(comp, bb.Lambda):
      name, body = comp.parameter_name, comp.result
      if name is None:
        return lambda: self.eval(body, env)
      return lambda arg: self.eval(body, _Env({name: arg}, env))
    if isinstance(comp, bb.CompiledComputation):
      if comp.proto.WhichOneof('computation') != 'tensorflow':
        raise ValueError(f'In-process backend: unsupported compiled computation '
                         f'{comp.proto.WhichOneof("computation")!r}.')
      return self.tensorflow(comp)
    if isinstance(comp, bb.Intrinsic):
      return self.intrinsic(comp.uri)
    if isinstance(comp, bb.Literal):
      return tf.constant(comp.value, dtype=comp.type_signature.dtype)
    raise ValueError(f'In-process backend: unsupported building block '
                     f'{type(comp).__name__}: {comp.compact_representation()[:200]}')

  def _on_client(self, k: int, fn: Callable, *args):
    if len(self.devices) > 1:
      with tf.device(self.devices[k % len(self.devices)]):
        return fn(*args)
    return fn(*args)

  def intrinsic(self, uri: str) -> Callable:
    n = self.num_clients
    clients, server = placements.CLIENTS, placements.SERVER
    if uri in ('federated_map', 'federated_apply', 'federated_map_all_equal'):
      def fmap(arg):
        fn, x = arg[0], arg[1]
        if x.placement is server:
          return _Fed(server, fn(x.value), True)
        if uri == 'federated_map_all_equal' and x.all_equal:
          return _Fed(clients, fn(x.value), True)
        if isinstance(fn, _TensorFlowFunction):
          return _Fed(clients, fn.map(x.members(n), self._training_slots
                                      if fn.takes_datasets and not fn.seeded_random
                                      else self._client_slots), False)
        return _Fed(clients, [self._on_client(k, fn, v)
                              for k, v in enumerate(x.members(n))], False)
      return fmap
    if uri == 'federated_broadcast':
      return lambda x: _Fed(clients, x.value, True)
    if uri == 'federated_value_at_server':
      return lambda v: _Fed(server, v, True)
    if uri == 'federated_value_at_clients':
      return lambda v: _Fed(clients, v, True)
    if uri == 'federated_eval_at_server':
      return lambda fn: _Fed(server, fn(), True)
    if uri == 'federated_eval_at_clients':
      return lambda fn: _Fed(clients, [self._on_client(k, fn) for k in range(n)], False)
    if uri in ('federated_zip_at_clients', 'federated_zip_at_server'):
      return self._zip(clients if uri.endswith('clients') else server)
    if uri == 'federated_aggregate':
      def aggregate(arg):
        x, zero, accumulate, report = arg[0], arg[1], arg[2], arg[4]
        if isinstance(accumulate, _TensorFlowFunction):
          acc = accumulate.fold(zero, x.members(n))
        else:
          acc = zero
          for v in x.members(n):
            acc = accumulate(structure.Struct([(None, acc), (None, v)]))
        return _Fed(server, report(acc), True)
      return aggregate
    if uri == 'federated_sum':
      def fsum(x):
        members = x.members(n)
        if not members:
          raise ValueError('In-process backend: federated_sum over zero clients.')
        total = members[0]
        for v in members[1:]:
          total = _add(total, v)
        return _Fed(server, total, True)
      return fsum
    if uri in ('federated_mean', 'federated_weighted_mean'):
      def mean(arg):
        if uri == 'federated_mean':
          values, weights = arg.members(n), [1.0] * n
        else:
          values, weights = arg[0].members(n), arg[1].members(n)
        total_w = sum(tf.cast(w, tf.float64) for w in weights)
        total = None
        for v, w in zip(values, weights):
          term = _map(lambda t, w=w: t * tf.cast(w, t.dtype), v)
          total = term if total is None else _add(total, term)
        return _Fed(server, _map(lambda t: t / tf.cast(total_w, t.dtype), total), True)
      return mean
    if uri in _UNSUPPORTED:
      raise ValueError(f'In-process backend: intrinsic {uri!r} is not supported; '
                       'use --backend=cpp.')
    raise ValueError(f'In-process backend: unknown intrinsic {uri!r}; use --backend=cpp.')

  def _zip(self, placement):
    n = self.num_clients

    def leaves(x):
      if isinstance(x, _Fed):
        return [x]
      return [leaf for e in structure.flatten(x) for leaf in leaves(e)] if isinstance(
          x, structure.Struct) else [x]

    def member(x, k):
      if isinstance(x, _Fed):
        return x.value if (x.all_equal or placement is placements.SERVER) else x.value[k]
      return structure.Struct([(name, member(e, k)) for name, e in structure.iter_elements(x)])

    def fzip(x):
      all_equal = all(f.all_equal for f in _feds(x))
      if placement is placements.SERVER or all_equal:
        return _Fed(placement, member(x, 0), True)
      return _Fed(placement, [member(x, k) for k in range(n)], False)
    return fzip


def _feds(x):
  if isinstance(x, _Fed):
    yield x
  elif isinstance(x, structure.Struct):
    for e in structure.iter_elements(x):
      yield from _feds(e[1])


# ------------------------------------------------------ whole-call tracing --


class _NotTraceable(Exception):
  """This computation is interpreted call by call instead (see `_Traced`)."""


class _Variant:
  """A dataset inside a traced computation: `_flatten` needs only its variant."""
  __slots__ = ('_variant_tensor',)

  def __init__(self, variant):
    self._variant_tensor = variant


_TENSOR, _DATASET = object(), object()


def _pack(value, leaves: list, key: list, traced: bool = False):
  """`value` as a template: its tensors (datasets' variants) moved to `leaves`.

  `key` receives what identifies the template (placements, cardinalities,
  names, dtypes, shapes). With `traced`, `value` is a result being traced:
  a dataset there cannot leave the graph, and the computation is not traced.
  """
  if isinstance(value, _Fed):
    key.append((value.placement.uri, value.all_equal,
                None if value.all_equal else len(value.value)))
    inner = (_pack(value.value, leaves, key, traced) if value.all_equal
             else [_pack(v, leaves, key, traced) for v in value.value])
    return _Fed(value.placement, inner, value.all_equal)
  if isinstance(value, structure.Struct):
    elements = structure.to_elements(value)
    key.append(tuple(name for name, _ in elements))
    return structure.Struct([(name, _pack(v, leaves, key, traced)) for name, v in elements])
  if isinstance(value, tf.Tensor):
    leaves.append(value)
    key.append((value.dtype, tuple(value.shape)))
    return _TENSOR
  if isinstance(value, tf.data.Dataset) and not traced:
    leaves.append(value._variant_tensor)  # pylint: disable=protected-access
    key.append('dataset')
    return _DATASET
  raise _NotTraceable(f'a value of type {type(value).__name__}')


def _unpack(template, leaves):
  """`_pack`'s inverse, from an iterator over the leaves."""
  if template is _TENSOR:
    return next(leaves)
  if template is _DATASET:
    return _Variant(next(leaves))
  if isinstance(template, _Fed):
    inner = (_unpack(template.value, leaves) if template.all_equal
             else [_unpack(v, leaves) for v in template.value])
    return _Fed(template.placement, inner, template.all_equal)
  return structure.Struct([(name, _unpack(v, leaves))
                           for name, v in structure.iter_elements(template)])


class _Traced:
  """Whole computations, each traced once per argument shape into one tf.function.

  Interpreting a round call by call cost ~10 ms of Python and ~17 TensorFlow
  dispatches on FedAvg. Here the interpreter runs once, while a tf.function is
  traced: every TensorFlow computation it meets becomes a call op of that
  function (`_TensorFlowFunction._traced_call`), federated values are Python
  lists of symbolic tensors, and later calls with arguments of the same
  template (cohort size, dtypes, shapes) are one TensorFlow call. Independent
  work (e.g. one client's weighting next to the next client's training) may
  then overlap. A computation that cannot be traced (a graph TensorFlow cannot
  call from a function, a dataset in the result) is interpreted call by call.
  """

  _MAX_TRACES = 16  # per computation (cohort sizes, shapes); beyond, eager

  def __init__(self, host_datasets: bool = False):
    self._host_datasets = host_datasets  # then calls taking datasets are interpreted
    # (id(block), #clients, template key) -> (block, (function, result template) or None)
    self._functions: dict = {}
    self._counts: dict = {}  # id(block) -> (block, number of templates traced)

  def call(self, num_clients: int, block: bb.Lambda, arg, interpret: Callable):
    """`interpret(arg)` (the block, interpreted), as one traced call when it can."""
    leaves, key = [], []
    try:
      template = _pack(arg, leaves, key) if arg is not None else None
      if self._host_datasets and 'dataset' in key:
        raise _NotTraceable('datasets stay on the host')
    except _NotTraceable:
      template, leaves, key = None, None, None
    if leaves is not None:
      cache_key = (id(block), num_clients, tuple(key))
      entry = self._functions.get(cache_key)
      if entry is None or entry[0] is not block:
        entry = (block, self._trace(block, template, leaves, interpret))
        self._functions[cache_key] = entry
      if entry[1] is not None:
        concrete, result_template = entry[1]
        outputs = _call_calls(concrete, leaves)
        return _unpack(result_template, iter(outputs))
    return interpret(arg)

  def _trace(self, block, template, leaves, interpret):
    count = self._counts.get(id(block))
    n = count[1] if count is not None and count[0] is block else 0
    if n >= self._MAX_TRACES:
      return None
    self._counts[id(block)] = (block, n + 1)
    result_template = []

    def body(*flat):
      result = interpret(None if template is None else _unpack(template, iter(flat)))
      outputs = []
      result_template.append(_pack(result, outputs, [], traced=True))
      return outputs

    signature = [tf.TensorSpec(t.shape, t.dtype) for t in leaves]
    try:
      concrete = _trace_unordered(body, signature)
    except (_NotTraceable, tf.errors.InternalError) as e:
      logging.warning('In-process backend: a computation of type %s is interpreted '
                      'call by call, not traced as a whole (%s).',
                      block.type_signature, str(e).splitlines()[0][:200])
      self._counts[id(block)] = (block, self._MAX_TRACES)  # not again
      return None
    return concrete, result_template[0]


# ---------------------------------------------------------------- executor --


def _ingest(value, type_spec):
  """A Python value of `type_spec` -> the interpreter's representation."""
  if isinstance(type_spec, computation_types.FederatedType):
    if type_spec.placement is placements.CLIENTS and not type_spec.all_equal:
      return _Fed(placements.CLIENTS, [_ingest(v, type_spec.member) for v in value], False)
    return _Fed(type_spec.placement, _ingest(value, type_spec.member), True)
  if isinstance(type_spec, computation_types.StructType):
    if isinstance(value, structure.Struct):
      elements = [v for _, v in structure.iter_elements(value)]
    else:
      container = structure.from_container(value)
      names = dict(structure.iter_elements(container)) if isinstance(value, dict) else None
      elements = ([names[name] for name, _ in structure.iter_elements(type_spec)]
                  if names is not None else [v for _, v in structure.iter_elements(container)])
    return structure.Struct([(name, _ingest(v, t)) for (name, t), v in zip(
        structure.iter_elements(type_spec), elements)])
  if isinstance(type_spec, computation_types.SequenceType):
    if not isinstance(value, tf.data.Dataset):
      raise TypeError(f'In-process backend: expected a tf.data.Dataset for {type_spec}, '
                      f'got {type(value).__name__}.')
    return value
  if isinstance(type_spec, computation_types.TensorType):
    return value if isinstance(value, tf.Tensor) else tf.constant(
        np.asarray(value, dtype=type_spec.dtype))
  raise TypeError(f'In-process backend: cannot ingest a value of type {type_spec}.')


def _materialise(value):
  """The interpreter's representation -> what a RemoteExecutor's compute() gives."""
  if isinstance(value, _Fed):
    if value.all_equal:
      return _materialise(value.value)
    return [_materialise(v) for v in value.value]
  if isinstance(value, structure.Struct):
    return structure.Struct([(name, _materialise(v))
                             for name, v in structure.iter_elements(value)])
  if isinstance(value, tf.Tensor):
    return value.numpy()
  return value


class _Value(executor_value_base.ExecutorValue):

  def __init__(self, value, type_spec, block=None):
    self._value, self._type = value, type_spec
    self.block = block  # the computation's building block, for functions

  @property
  def type_signature(self):
    return self._type

  @property
  def reference(self):
    return self._value

  async def compute(self):
    return _materialise(self._value)


class InProcessExecutor(executor_base.Executor):
  """Interprets natively compiled TFF computations in this Python process."""

  def __init__(self, num_clients: int, devices: list[str], cache: dict,
               host_datasets: bool = False, lanes: int = 1):
    # Building blocks and imported TF functions are shared by all cohort sizes.
    self._cache = cache.setdefault('computations', {})
    self._interpreter = _Interpreter(num_clients, devices, cache.setdefault('tf', {}),
                                     host_datasets, lanes)
    self._traced = cache.setdefault('traced', _Traced(host_datasets))

  def close(self):
    pass

  async def create_value(self, value, type_spec=None):
    if isinstance(value, (computation_impl.ConcreteComputation, pb.Computation)):
      block = self._block(value)
      return _Value(self._interpreter.eval(block, None), type_spec,
                    block if isinstance(block, bb.Lambda) else None)
    return _Value(_ingest(value, type_spec), type_spec)

  def _block(self, comp):
    key = id(comp)
    entry = self._cache.get(key)
    if entry is None or entry[0] is not comp:
      proto = (comp if isinstance(comp, pb.Computation)
               else computation_impl.ConcreteComputation.get_proto(comp))
      block = bb.ComputationBuildingBlock.from_proto(proto)
      entry = (comp, block)
      self._cache[key] = entry
    return entry[1]

  async def create_call(self, comp, arg=None):
    fn = comp.reference
    interpret = lambda a: fn() if a is None else fn(a)
    arg = None if arg is None else arg.reference
    if comp.block is not None:  # a whole computation: one traced TensorFlow call
      result = self._traced.call(self._interpreter.num_clients, comp.block, arg, interpret)
    else:
      result = interpret(arg)
    return _Value(result, comp.type_signature.result)

  async def create_struct(self, elements):
    elements = structure.to_elements(structure.from_container(elements))
    return _Value(structure.Struct([(n, v.reference) for n, v in elements]),
                  computation_types.StructType([(n, v.type_signature) for n, v in elements]))

  async def create_selection(self, source, index):
    return _Value(source.reference[index], source.type_signature[index])


def compile_for_inprocess(comp: computation_impl.ConcreteComputation):
  """TFF's native compilation without its rewrites of the TensorFlow graphs.

  `native_compiler.desugar_and_transform_to_native` (what the C++ worker gets)
  desugars intrinsics and brings the computation to call-dominant form, as
  here, then (1) runs Grappler once, statically, over each TensorFlow graph and
  (2) turns Grappler off in the graphs' function calls at run time. Measured
  in one process on the EMNIST CNN client update (10 clients x 10 steps): its
  graph 1.12x the same steps in plain `tf.function`s; without (1) and (2) 0.97x;
  without (1) only 1.57x. TensorFlow's run-time Grappler (function inlining,
  op fusion) does better than the static pass, so here neither is applied;
  with a GPU, computations that take datasets get (1) (`_inline_function_calls`).
  """
  block, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
      comp.to_building_block())
  try:
    block = transformations.to_call_dominant(block)
  except ValueError:  # as the native compiler: left as it is
    pass
  return computation_impl.ConcreteComputation(
      computation_proto=block.proto, context_stack=context_stack_impl.context_stack)


def gpu_devices() -> list[str]:
  return [d.name for d in tf.config.list_logical_devices('GPU')]


def default_concurrent_clients(host_datasets: bool) -> int:
  """Clients trained at once per device: up to 4, one per CPU core; 1 with
  `host_datasets` (client calls are eager, one at a time).

  Measured on the 2-core VM, EMNIST CNN, 10 clients of 10 steps in one traced
  call: 2 at once took 0.875x the time of 1 (CPU use 1.74 -> 1.88 cores), 3
  0.92x, 4 0.90x. Not measured on more cores; `concurrent_clients` sets it.
  """
  return 1 if host_datasets else max(1, min(4, os.cpu_count() or 1))


def effective_concurrent_clients(concurrent_clients: Optional[int] = None,
                                 host_datasets: Optional[bool] = None) -> int:
  """What `create_context` uses: `concurrent_clients`, or the default for
  `host_datasets` (default: when TensorFlow sees a GPU); ValueError if bad."""
  if concurrent_clients is None:
    if host_datasets is None:
      host_datasets = bool(gpu_devices())
    return default_concurrent_clients(host_datasets)
  context.check_concurrent_clients(concurrent_clients)
  return concurrent_clients


def create_context(devices: Optional[list[str]] = None,
                   host_datasets: Optional[bool] = None,
                   concurrent_clients: Optional[int] = None):
  """A sync TFF context running everything in this process (GPU if visible).

  `host_datasets` (default: when TensorFlow sees a GPU) keeps datasets on the
  host: computations that take datasets (client training) get TFF's static
  function inlining and run as their own calls, one per client, rather than
  inside a traced round (see `_inline_function_calls`).

  `concurrent_clients` (default `default_concurrent_clients`): how many
  clients of a round train at once on each device, each on an import of the
  client computation of its own (its own variables). Results do not depend on
  it (tests/test_backends.py).
  """
  gpus = gpu_devices()
  devices = gpus if devices is None else devices
  host_datasets = bool(gpus) if host_datasets is None else host_datasets
  lanes = effective_concurrent_clients(concurrent_clients, host_datasets)
  cache: dict = {}

  def stack_fn(cardinalities):
    return InProcessExecutor(cardinalities.get(tff.CLIENTS, 0), devices, cache,
                             host_datasets, lanes)

  return sync_execution_context.SyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
          executor_stack_fn=stack_fn),
      compiler_fn=compile_for_inprocess,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
