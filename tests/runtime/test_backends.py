"""Execution backends give the default backend's results.

* `--backend=inprocess` (our interpreter of TFF's natively compiled computations,
  running TF in this process) == the C++ worker, for FedAvg by default;
* `--workers=2` (TFF's MergeableCompExecutionContext over two loopback
  worker_binary processes) == one local worker; its workers are stopped on close;
* both, for every registered algorithm, under `-m slow`;
* a worker started with `python -m tff_algos.runtime.worker` serves
  `--workers=localhost:PORT` and stops cleanly on SIGTERM.

On a machine with a GPU the in-process backend runs there, so every
in-process test above compares GPU training with the C++ worker's CPU
training; one more test (skipped without a GPU) checks that a CNN's clients
really train on the GPU. TF32, TensorFlow's default on Ampere and newer GPUs,
is turned off here: it rounds matmul and convolution inputs to 10-bit
mantissas, far outside this file's 1e-5.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

from conftest import wait_dead, worker_pids_of
from paths import ROOT
from tasks import TaskOptions, get_task
from tff_algos import runtime
from tff_algos.algorithms import fedopt
from tff_algos.core import optimizers, stateful_process
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

ATOL = 1e-5
GPUS = tf.config.list_logical_devices('GPU')


@pytest.fixture(autouse=True, scope='module')
def no_tf32():
  """TF32 off for this file's tests only (see the module docstring)."""
  before = tf.config.experimental.tensor_float_32_execution_enabled()
  tf.config.experimental.enable_tensor_float_32_execution(False)
  yield
  tf.config.experimental.enable_tensor_float_32_execution(before)
NUM_CLIENTS = 5  # odd: two workers get 3 and 2 clients (conftest's client_data)


def run_rounds(process, data, rounds, context=None, stateful=False):
  """Final state and metrics (and client states of stateful-client algorithms)."""
  scope = (context_stack_impl.context_stack.install(context) if context is not None
           else contextlib.nullcontext())
  with scope:
    state = (process.initialize(stateful_process.Population(20, 30.0)) if stateful
             else process.initialize())
    client_states = [process.initial_client_state(state)] * len(data) if stateful else None
    for _ in range(rounds):
      out = (process.next(state, data, client_states) if stateful
             else process.next(state, data))
      state = out.state
      client_states = out.client_states if stateful else None
  return (state, client_states) if stateful else state, out.metrics


def leaves(structure):
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


def assert_same(a, b, atol=ATOL):
  a, b = leaves(a), leaves(b)
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=0, atol=atol)


def fedavg(task):
  return fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=3, server_learning_rate=1.0))


@contextlib.contextmanager
def backend(**kwargs):
  ctx = runtime.ManagedContext(**kwargs)
  try:
    yield ctx
  finally:
    ctx.close()


def test_inprocess_backend_equals_cpp_backend(task, client_data):
  process = fedavg(task).process
  cpp_state, cpp_metrics = run_rounds(process, client_data, 3)
  with backend(backend='inprocess') as ctx:
    assert ctx.pids == []  # no worker process at all
    state, metrics = run_rounds(process, client_data, 3, ctx.context)
  assert_same(state, cpp_state)
  assert_same(metrics, cpp_metrics)
  # The model moved (the comparison is not between two untouched initial states).
  init = leaves(process.get_model_weights(process.initialize()).trainable)
  moved = leaves(process.get_model_weights(state).trainable)
  assert max(np.abs(x - y).max() for x, y in zip(init, moved)) > 1e-2


@pytest.mark.parametrize('name', ['fedavg', 'scaffold'])
def test_inprocess_host_datasets_mode_equals_cpp_backend(task, client_data, name, monkeypatch):
  """The path taken with a GPU, forced on here: computations taking datasets get
  TFF's static function inlining and run call by call, outside traced rounds."""
  from tff_algos.runtime import inprocess
  from tff_algos.runtime.inprocess import graph_surgery
  inlined = []
  inline = graph_surgery.inline_function_calls
  monkeypatch.setattr(graph_surgery, 'inline_function_calls',
                      lambda comp: inlined.append(comp) or inline(comp))
  stateful = name == 'scaffold'
  process = (fedavg(task).process if name == 'fedavg' else
             algorithm_flags.build(name, task.model_fn, HParams(local_steps=2)).process)
  cpp, cpp_metrics = run_rounds(process, client_data, 2, stateful=stateful)
  ours, metrics = run_rounds(process, client_data, 2,
                             inprocess.create_context(host_datasets=True), stateful=stateful)
  assert len(inlined) == 1  # the client work, the only computation taking datasets
  assert_same(ours, cpp)
  assert_same(metrics, cpp_metrics)


def _all_ancestors(op) -> set:
  """The ops `op` waits for: its inputs' and control inputs' ops, transitively."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for parent in [t.op for t in current.inputs] + list(current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        todo.append(parent)
  return seen


def test_inprocess_reads_containers_as_tff_converts_them():
  """The in-process backend reads a value's containers directly; it gets the
  elements `structure.from_container` gives, in the type's order."""
  import collections
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.types import type_conversions
  from tff_algos.runtime.inprocess import values
  point = collections.namedtuple('Point', ['y', 'x'])
  weights = tff.learning.models.ModelWeights(trainable=[np.ones(2, np.float32)],
                                             non_trainable=[np.zeros(1, np.float32)])
  cases = [collections.OrderedDict(b=np.int32(1), a=np.float32(2.0)),
           {'b': np.int32(1), 'a': np.float32(2.0)}, weights, point(np.int32(1), np.float32(2)),
           [np.int32(1), np.float32(2.0)], (np.int32(1), np.float32(2.0)),
           {'outer': weights, 'n': np.int32(3)}]
  for value in cases:
    type_spec = type_conversions.infer_type(value)
    got = values.ingest(value, type_spec)
    expected = structure.from_container(value, recursive=True)
    flat_got = [np.asarray(x) for x in structure.flatten(got)]
    flat_expected = [np.asarray(x) for x in structure.flatten(expected)]
    assert [x.dtype for x in flat_got] == [x.dtype for x in flat_expected], value
    for x, y in zip(flat_got, flat_expected):
      np.testing.assert_array_equal(x, y)
    assert structure.name_list(got) == structure.name_list(expected)


def test_struct_like_equals_tffs_checked_struct():
  """`values.struct_like` (no per-element checks) makes the Struct that
  `structure.Struct` makes: equal, same hash, names, access by name and index,
  elements; and the name table it shares is never changed by either."""
  from tensorflow_federated.python.common_libs import structure
  from tff_algos.runtime.inprocess import values
  assert values._FAST_STRUCTS  # pylint: disable=protected-access  # TFF's Struct as pinned
  like = structure.Struct([('a', 1), (None, 2), ('c', 3)])
  type_like = tff.StructType([('a', np.int32), (None, np.float32), ('c', np.int64)])
  for template in (like, type_like):
    fast = values.struct_like(template, ['x', 'y', 'z'])
    checked = structure.Struct([('a', 'x'), (None, 'y'), ('c', 'z')])
    assert fast == checked and hash(fast) == hash(checked)
    assert structure.to_elements(fast) == structure.to_elements(checked)
    assert structure.name_list_with_nones(fast) == ['a', None, 'c']
    assert (fast.a, fast[1], fast['c'], list(fast), len(fast)) == ('x', 'y', 'z', ['x', 'y', 'z'], 3)
    assert fast != structure.Struct([('a', 'x'), ('b', 'y'), ('c', 'z')])
  assert structure.name_list_with_nones(like) == ['a', None, 'c'] and like.c == 3


def test_inprocess_scalar_results_go_back_as_their_tensors():
  """A numpy scalar the backend returned is fed back as the tensor it came
  from (no new constant); an equal scalar made elsewhere, or one given for
  another dtype, is converted."""
  from tff_algos.runtime.inprocess import values
  tensor = tf.constant(np.float64(2.5))
  scalar = values.materialise(tensor)
  assert isinstance(scalar, np.float64) and scalar == 2.5
  assert values.ingest(scalar, tff.TensorType(np.float64)) is tensor
  other = values.ingest(np.float64(2.5), tff.TensorType(np.float64))
  assert other is not tensor and float(other) == 2.5
  as_float32 = values.ingest(scalar, tff.TensorType(np.float32))
  assert as_float32.dtype == tf.float32 and float(as_float32) == 2.5
  for _ in range(values._MAX_SCALARS):  # pylint: disable=protected-access
    values.materialise(tf.constant(np.int32(1)))
  assert values.ingest(scalar, tff.TensorType(np.float64)) is not tensor  # forgotten


def test_inprocess_compiles_each_computation_once(task, client_data, monkeypatch):
  """Compilations are looked up by the computation's identity (TFF's cache
  serializes the computation on every call to hash it)."""
  from tff_algos.runtime import inprocess
  from tff_algos.runtime.inprocess import executor
  compiled = []
  compile_fn = executor.compile_for_inprocess
  monkeypatch.setattr(executor, 'compile_for_inprocess',
                      lambda comp: compiled.append(comp) or compile_fn(comp))
  from tensorflow_federated.python.core.impl.computation import computation_impl
  hashed = []
  hash_fn = computation_impl.ConcreteComputation.__hash__
  monkeypatch.setattr(computation_impl.ConcreteComputation, '__hash__',
                      lambda comp: hashed.append(comp) or hash_fn(comp))
  process = fedavg(task).process
  with context_stack_impl.context_stack.install(inprocess.create_context()):
    state = process.initialize()
    for _ in range(3):
      state = process.next(state, client_data).state
  assert compiled == [process.initialize, process.next]
  assert process.next not in hashed


def test_equal_tensorflow_computations_share_one_import(task, client_data):
  """Two rounds composed into one computation (each round's TensorFlow
  computations copied into it) import what one round imports, not twice as
  much, and give the two rounds run one by one, bit for bit."""
  from tff_algos.runtime import inprocess
  process = fedavg(task).process
  state_type, data_type = process.next.type_signature.parameter

  @tff.federated_computation(state_type, data_type)
  def two_rounds(state, data):
    return process.next(process.next(state, data).state, data).state

  one, two = [], []
  with context_stack_impl.context_stack.install(inprocess.create_context(
      on_new_function=one.append)):
    state = process.initialize()
    expected = process.next(process.next(state, client_data).state, client_data).state
  with context_stack_impl.context_stack.install(inprocess.create_context(
      on_new_function=two.append)):
    state = process.initialize()
    got = two_rounds(state, client_data)
  assert 0 < len(two) <= len(one)
  assert_same(got, expected, atol=0)


@pytest.mark.parametrize('name', ['fedavg', 'scaffold'])
def test_concurrent_clients_run_unordered_and_equal_cpp_backend(task, client_data, name,
                                                                monkeypatch):
  """3 clients at a time (5 clients: lanes of 2, 2 and 1), each lane an import
  of the client work of its own. In the traced round, no call of one lane
  waits for a call of another (tf.function's automatic control dependencies
  had chained them all); the model is the C++ worker's."""
  from tff_algos.runtime import inprocess
  from tff_algos.runtime.inprocess import tf_calls
  functions, traces = [], []
  trace = tf_calls.trace_unordered
  monkeypatch.setattr(tf_calls, 'trace_unordered',
                      lambda *a: traces.append(trace(*a)) or traces[-1])
  stateful = name == 'scaffold'
  process = (fedavg(task).process if name == 'fedavg' else
             algorithm_flags.build(name, task.model_fn, HParams(local_steps=2)).process)
  cpp, cpp_metrics = run_rounds(process, client_data, 2, stateful=stateful)
  ours, metrics = run_rounds(process, client_data, 2,
                             inprocess.create_context(concurrent_clients=3,
                                                      on_new_function=functions.append),
                             stateful=stateful)
  assert_same(ours, cpp)
  assert_same(metrics, cpp_metrics)

  laned = [f for f in functions if len(f.imports) > 1]
  # The client work only (the one computation taking datasets).
  assert [len(f.imports) for f in laned] == [3]
  lane_of = {imp.compute.name.decode(): j  # the traceable function of each lane
             for j, imp in enumerate(laned[0].imports)}
  graph = traces[-1].graph  # the round (`next`), traced last
  calls = [op for op in graph.get_operations()
           if op.type in ('StatefulPartitionedCall', 'PartitionedCall')
           and op.get_attr('f').name in lane_of]
  assert sorted(lane_of[op.get_attr('f').name] for op in calls) == [0, 0, 1, 1, 2]
  for op in calls:
    lanes_waited = {lane_of[a.get_attr('f').name] for a in _all_ancestors(op)
                    if a in calls}
    assert lanes_waited <= {lane_of[op.get_attr('f').name]}


def test_host_datasets_pins_the_input_pipeline_to_the_cpu_in_function_bodies():
  """The GPU path's pinning reaches iterators made inside tf.cond branches
  (on an H100, TensorFlow placed such an iterator on the GPU and crashed)."""
  from tff_algos.core import local_training
  from tff_algos.runtime.inprocess import graph_surgery

  @tf.function
  def total(dataset, go):
    return tf.cond(go, lambda: local_training.fold(dataset, tf.constant(0, tf.int64), tf.add),
                   lambda: tf.constant(0, tf.int64))

  graph_def = total.get_concrete_function(
      tf.data.Dataset.range(3), tf.TensorSpec([], tf.bool)).graph.as_graph_def()
  graph_surgery.pin_input_pipeline_to_cpu(graph_def)
  bodies = [n for f in graph_def.library.function for n in f.node_def]
  pipeline = [n for n in list(graph_def.node) + bodies
              if graph_surgery.is_input_pipeline_op(n.op)]
  assert {'AnonymousIteratorV3', 'IteratorGetNextAsOptional', 'OptionalGetValue'} <= {
      n.op for n in bodies if n in pipeline}
  assert all(n.device == '/device:CPU:0' for n in pipeline)
  assert all(n.device == '' for n in bodies if n.op == 'AddV2')  # compute is left free


def test_host_datasets_aggregation_fold_passes_datasets_serialized():
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tff_algos.runtime import inprocess

  @tff.tensorflow.computation(np.int64, tff.SequenceType(np.int64))
  def add_sum(acc, dataset):
    return acc + dataset.reduce(np.int64(0), lambda a, b: a + b)

  fn = inprocess.TensorFlowFunction(
      computation_impl.ConcreteComputation.get_proto(add_sum), add_sum.type_signature,
      host_datasets=True)
  total = fn.fold(tf.constant(0, tf.int64), [tf.data.Dataset.range(3), tf.data.Dataset.range(5)])
  assert int(total) == 3 + 10


@pytest.mark.skipif(not GPUS, reason='needs a GPU (run it on one: docs/performance.md)')
def test_gpu_inprocess_backend_trains_a_cnn_on_the_gpu_as_the_cpp_worker_on_cpu():
  import collections
  from tasks import base, partition
  rng = np.random.default_rng(0)
  n = NUM_CLIENTS * 3 * 16
  features = collections.OrderedDict(
      x=rng.random((n, 28, 28, 1), dtype=np.float32),
      y=rng.integers(0, 10, n).astype(np.int32))
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  cnn = base.Task(
      name='cnn', train_data=partition.to_client_data(
          features, np.array_split(np.arange(n), NUM_CLIENTS)),
      preprocess_fn=lambda ds: ds.batch(16),
      model_fn=base.logits_classifier_fn(lambda: tf.keras.Sequential([
          tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
          tf.keras.layers.MaxPooling2D(),
          tf.keras.layers.Flatten(),
          tf.keras.layers.Dense(10)]), spec))
  data = [cnn.client_dataset(cid) for cid in cnn.client_ids]
  process = fedavg(cnn).process
  cpp_state, cpp_metrics = run_rounds(process, data, 3)
  tf.config.experimental.reset_memory_stats(GPUS[0].name)
  with backend(backend='inprocess') as ctx:
    state, metrics = run_rounds(process, data, 3, ctx.context)
  # A client's batch of conv activations alone is 16 x 26 x 26 x 32 floats.
  assert tf.config.experimental.get_memory_info(GPUS[0].name)['peak'] > 16 * 26 * 26 * 32 * 4
  assert_same(state, cpp_state)
  assert_same(metrics, cpp_metrics)
  init = leaves(process.get_model_weights(process.initialize()).trainable)
  moved = leaves(process.get_model_weights(state).trainable)
  assert max(np.abs(x - y).max() for x, y in zip(init, moved)) > 1e-2


def test_inprocess_round_is_one_traced_tensorflow_call(task, client_data, monkeypatch):
  """After the first round, a round is one call of a traced tf.function.

  Nothing is interpreted per round (no eager chunk calls, no new traces); a
  new cohort size traces once more, and its rounds equal the C++ worker's.
  """
  from tff_algos.runtime import inprocess
  counts = {'interpreted': 0, 'trace': 0}

  def counted(name, fn):
    def wrapper(*args, **kwargs):
      counts[name] += 1
      return fn(*args, **kwargs)
    return wrapper

  for method in ('__call__', 'map', 'fold'):  # every use of a TensorFlow computation
    monkeypatch.setattr(inprocess.TensorFlowFunction, method,
                        counted('interpreted', getattr(inprocess.TensorFlowFunction, method)))
  monkeypatch.setattr(inprocess.WholeCallTracer, 'trace',
                      counted('trace', inprocess.WholeCallTracer.trace))
  process = fedavg(task).process
  with backend(backend='inprocess') as ctx, \
      context_stack_impl.context_stack.install(ctx.context):
    state = process.next(process.initialize(), client_data).state
    assert counts['trace'] == 2  # initialize, next
    counts.update(interpreted=0, trace=0)
    for _ in range(2):
      state = process.next(state, client_data).state
    assert counts == {'interpreted': 0, 'trace': 0}
    state = process.next(state, client_data[:3]).state
    assert counts['trace'] == 1 and counts['interpreted'] > 0  # interpreted while traced
  cpp_state = process.initialize()
  for data in (client_data,) * 3 + (client_data[:3],):
    cpp_state = process.next(cpp_state, data).state
  assert_same(state, cpp_state)


def test_inprocess_backend_plain_tensorflow_and_federated_calls():
  with backend(backend='inprocess') as ctx, \
      context_stack_impl.context_stack.install(ctx.context):

    @tff.tensorflow.computation(tf.float32, tf.int32)
    def scale(x, n):
      return x * tf.cast(n, tf.float32)

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS),
                               tff.FederatedType(np.float32, tff.CLIENTS))
    def stats(x, w):
      return (tff.federated_sum(x), tff.federated_mean(x, weight=w),
              tff.federated_mean(x), tff.federated_broadcast(tff.federated_sum(w)))

    assert scale(1.5, 4) == 6.0
    total, weighted, mean, broadcast = stats([1.0, 2.0, 6.0], [1.0, 1.0, 2.0])
    assert total == 9.0 and mean == 3.0
    np.testing.assert_allclose(weighted, (1 + 2 + 12) / 4, rtol=1e-6)
    assert broadcast == 4.0  # an all-equal CLIENTS value: one member

  # Client work placed round-robin on devices (as on several GPUs; here CPU twice).
  from tff_algos.runtime import inprocess
  with context_stack_impl.context_stack.install(
      inprocess.create_context(devices=['/device:CPU:0'] * 2)):

    @tff.tensorflow.computation(tf.float32)
    def square(x):
      return x * x

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def squares(x):
      return tff.federated_map(square, x)

    assert squares([1.0, 2.0, 3.0]) == [1.0, 4.0, 9.0]


@pytest.mark.parametrize('mode', ['traced', 'chunked', 'eager'])
def test_inprocess_batched_client_calls_keep_order_and_fresh_variables(mode, monkeypatch):
  """federated_map / federated_aggregate run many clients per TensorFlow call.

  The clients of one map share the imported graph's variables, so each call
  must run after the previous one and after its own initialisation; the
  accumulator must see the clients in order. Three ways of running them:
  traced: the whole call traced into one tf.function (the default);
  chunked: interpreted call by call, 20 clients in chunks of 16 and 4;
  eager: one client at a time, the fallback for graphs TensorFlow cannot
  trace into a function (seen once, with graphs the native compiler's static
  Grappler pass had rewritten): the whole-call trace gives up, then chunks.
  """
  from tff_algos.runtime import inprocess
  if mode == 'chunked':  # no whole-call traces
    monkeypatch.setattr(inprocess.WholeCallTracer, 'MAX_TRACES_PER_COMPUTATION', 0)
  if mode == 'eager':  # whole-call tracing fails, as do batches
    from tff_algos.runtime.inprocess import tf_calls
    monkeypatch.setattr(tf_calls, 'noinline_function', lambda pruned, signature: None)
  with backend(backend='inprocess') as ctx, \
      context_stack_impl.context_stack.install(ctx.context):

    @tff.tensorflow.computation(tf.float32)
    def twice(x):
      v = tf.Variable(0.0)  # initialised to 0 before every call
      with tf.control_dependencies([v.assign_add(x)]):
        with tf.control_dependencies([v.assign_add(x)]):
          return v.read_value()

    @tff.tensorflow.computation(tf.int64, tf.int64)
    def append_digit(acc, x):  # not commutative: the order shows
      return acc * 3 + x

    @tff.tensorflow.computation(tf.int64, tf.int64)
    def merge(a, b):
      return a + b  # unused in a single aggregation

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS),
                               tff.FederatedType(np.int64, tff.CLIENTS))
    def each(x, d):
      return (tff.federated_map(twice, x),
              tff.federated_aggregate(d, np.int64(0), append_digit, merge,
                                      tff.tensorflow.computation(lambda a: a, tf.int64)))

    values = [float(i) for i in range(1, 21)]
    digits = [i % 3 for i in range(20)]
    doubled, number = each(values, digits)
    assert list(doubled) == [2 * v for v in values]
    assert number == int(''.join(map(str, digits)), 3)


def test_inprocess_backend_runs_desugared_min_and_refuses_unsupported_intrinsics():
  from tff_algos.runtime import inprocess
  with backend(backend='inprocess') as ctx, \
      context_stack_impl.context_stack.install(ctx.context):

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def smallest(x):
      return tff.federated_min(x)  # the native compiler lowers it to an aggregate

    assert smallest([3.0, 1.0, 2.0]) == 1.0
  interpreter = inprocess.Interpreter(2, [], {})
  for uri in ('federated_select', 'federated_secure_sum_bitwidth', 'sequence_reduce'):
    with pytest.raises(ValueError, match=f'{uri}.*not supported'):
      interpreter.intrinsic(uri)


def test_two_loopback_workers_equal_one_worker_and_stop(task, client_data):
  process = fedavg(task).process
  one_state, one_metrics = run_rounds(process, client_data, 3)
  before = set(worker_pids_of(os.getpid()))
  with backend(workers=2) as ctx:
    pids = ctx.pids
    assert len(pids) == 2 and set(pids) <= set(worker_pids_of(os.getpid()))
    state, metrics = run_rounds(process, client_data, 3, ctx.context)
  assert wait_dead(pids) == []
  assert set(worker_pids_of(os.getpid())) == before  # the session's worker only
  assert_same(state, one_state)
  assert_same(metrics, one_metrics)


def test_worker_module_serves_workers_flag_and_stops_on_sigterm(task, client_data):
  port = portpicker.pick_unused_port()
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)  # as a user starts it
  proc = subprocess.Popen([sys.executable, '-m', 'tff_algos.runtime.worker', f'--port={port}'],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    line = proc.stdout.readline()
    assert f'serving on port {port}' in line, line + proc.stderr.read()
    served = worker_pids_of(proc.pid)
    assert len(served) == 1
    process = fedavg(task).process
    one_state, _ = run_rounds(process, client_data, 1)
    with backend(workers=f'localhost:{port}') as ctx:
      assert ctx.pids == []  # not ours: used, never stopped by us
      state, _ = run_rounds(process, client_data, 1, ctx.context)
    assert_same(state, one_state)
    assert proc.poll() is None
  finally:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0
  assert wait_dead(served) == []
  # TensorFlow's start-up chatter (oneDNN, CUDA stubs, CPU features, TF-TRT and
  # the three spurious factory errors: nine lines) is not printed.
  for chatter in ('Unable to register', 'cpu_feature_guard', 'TF-TRT', 'oneDNN'):
    assert chatter not in err, err


def test_backend_and_workers_validation():
  assert runtime.parse_workers(None) is None
  assert runtime.parse_workers('3') == 3
  assert runtime.parse_workers('a:1, b:2') == ['a:1', 'b:2']
  for bad in ('0', 'host', 'host:port', ':80'):
    with pytest.raises(ValueError, match='--workers'):
      runtime.parse_workers(bad)
  with pytest.raises(ValueError, match='--backend must be one of'):
    runtime.check_backend('gpu')
  with pytest.raises(ValueError, match='not --backend=inprocess'):
    runtime.check_backend('inprocess', '2')
  runtime.check_backend('cpp', 'localhost:8000')
  runtime.check_backend('inprocess', None, 3)
  with pytest.raises(ValueError, match='for --backend=inprocess'):
    runtime.check_backend('cpp', None, 2)
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match='--concurrent_clients must be a positive'):
      runtime.check_backend('inprocess', None, bad)
  from tff_algos.runtime import inprocess
  with pytest.raises(ValueError, match='concurrent_clients must be a positive'):
    inprocess.create_context(concurrent_clients=0)


def test_calls_of_calls_leave_the_threads_function_options_as_they_were():
  """Traced rounds are called with Grappler off for them alone: the thread's
  options (which later eager calls of client graphs use) are restored, also
  when the call fails."""
  from tensorflow.core.protobuf import config_pb2
  from tensorflow.python.eager import context as eager_context
  from tff_algos.runtime.inprocess import tf_calls
  ctx = eager_context.context()
  options = ctx.function_call_options
  before = options.config_proto_serialized
  add_one = tf.function(lambda x: x + 1.0).get_concrete_function(
      tf.TensorSpec([], tf.float32))
  assert float(tf.nest.flatten(tf_calls.call_without_grappler(
      add_one, [tf.constant(1.0)]))[0]) == 2.0
  assert ctx.function_call_options.config_proto_serialized == before
  with pytest.raises(Exception):
    tf_calls.call_without_grappler(add_one, [tf.constant('not a float')])
  assert ctx.function_call_options.config_proto_serialized == before
  rewrite = lambda serialized: config_pb2.ConfigProto.FromString(  # noqa: E731
      serialized).graph_options.rewrite_options
  assert not rewrite(before).disable_meta_optimizer
  assert rewrite(tf_calls.options_without_grappler(options).config_proto_serialized
                 ).disable_meta_optimizer


def test_summary_records_the_lanes_the_inprocess_backend_uses():
  """--concurrent_clients defaults to a machine-dependent count: summary.json
  records the count used, not only the flag's value (None)."""
  from absl.testing import flagsaver
  from experiments.lib import runtime_flags
  from tff_algos.runtime import inprocess
  default = runtime_flags.values()
  assert default['backend'] == 'inprocess' and default['concurrent_clients'] is None
  assert default['effective_concurrent_clients'] == inprocess.default_concurrent_clients(
      bool(inprocess.gpu_devices())) >= 1
  with flagsaver.flagsaver(concurrent_clients=3):
    assert runtime_flags.values()['effective_concurrent_clients'] == 3
  with flagsaver.flagsaver(backend='cpp'):
    assert 'effective_concurrent_clients' not in runtime_flags.values()


def test_after_merge_results_keep_client_order_whoever_finishes_first():
  """The root cause, made deterministic: the first subround's worker is slower."""
  import asyncio
  import types

  class Worker:
    def __init__(self, delay, clients):
      self.delay, self.clients = delay, clients

    async def invoke(self, comp, arg):
      await asyncio.sleep(self.delay)
      return self.clients

  comp = types.SimpleNamespace(after_merge=None)
  contexts = [Worker(0.2, ['c0', 'c1', 'c2']), Worker(0.0, ['c3', 'c4'])]
  tff_order = asyncio.run(runtime.context.tff_after_merge_in_finishing_order(
      comp, 'merged', [None, None], contexts))
  ours = asyncio.run(runtime.context.after_merge_in_client_order(
      comp, 'merged', [None, None], contexts))
  assert tff_order == [['c3', 'c4'], ['c0', 'c1', 'c2']]  # TFF 0.87: finishing order
  assert ours == [['c0', 'c1', 'c2'], ['c3', 'c4']]


def test_two_workers_give_client_states_back_to_their_clients(task, client_data):
  """TFF 0.87 returns subrounds' CLIENTS results in the order workers finish;
  ours keeps client order, so SCAFFOLD's control variates go to the right
  clients (before the fix: up to 0.23 off one worker)."""
  process = algorithm_flags.build('scaffold', task.model_fn, HParams(local_steps=2)).process
  (one_state, one_clients), _ = run_rounds(process, client_data, 2, stateful=True)
  with backend(workers=2) as ctx:
    (state, clients), _ = run_rounds(process, client_data, 2, ctx.context, stateful=True)
  assert_same(state, one_state)
  assert_same(clients, one_clients)
  # The clients' states differ from each other: a permutation would show.
  rows = [leaves(c)[0] for c in one_clients]
  assert min(np.abs(a - b).max() for a in rows for b in rows if a is not b) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['inprocess', 'host_datasets', 'two_workers'])
@pytest.mark.parametrize('name', sorted(registry.ALGORITHMS))
def test_backends_equal_cpp_for_every_algorithm(task, client_data, name, kind):
  """host_datasets: the in-process backend's GPU path (forced on without one)."""
  if name == 'fedmax':  # needs a hidden layer
    task = get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='mlp'))
    client_data = [task.client_dataset(cid) for cid in task.client_ids[:NUM_CLIENTS]]
  algorithm = None
  for hp in (HParams(local_steps=2), HParams(),  # fedrr, nastya: one epoch
             HParams(client_optimizer='adam', client_learning_rate=0.01,
                     local_steps=2)):  # mfl, mime: an optimiser with statistics
    try:
      algorithm = algorithm_flags.build(name, task.model_fn, hp)
      break
    except ValueError:
      continue
  assert algorithm is not None, f'no test hyperparameters for {name}'
  process, stateful = algorithm.process, getattr(algorithm, 'stateful_clients', False)
  cpp_state, cpp_metrics = run_rounds(process, client_data, 2, stateful=stateful)
  if kind == 'host_datasets':
    from tff_algos.runtime import inprocess
    state, metrics = run_rounds(process, client_data, 2,
                                inprocess.create_context(host_datasets=True), stateful=stateful)
  else:
    with backend(**({'backend': 'inprocess'} if kind == 'inprocess' else {'workers': 2})) as ctx:
      state, metrics = run_rounds(process, client_data, 2, ctx.context, stateful=stateful)
  assert_same(state, cpp_state)
  assert_same(metrics, cpp_metrics)


@pytest.mark.slow
def test_trainer_backends_write_the_same_metrics(tmp_path):
  base = [sys.executable, '-m', 'experiments.train', '--task=digits', '--model=logistic',
          '--clients_per_round=5', '--client_batch_size=16', '--local_steps=3',
          '--total_rounds=2', '--rounds_per_eval=2', '--noprogress',
          f'--root_output_dir={tmp_path}']
  env = dict(os.environ, PYTHONPATH=ROOT)
  rows = {}
  for name, extra in [('cpp', ['--backend=cpp']), ('inprocess', []),  # the default
                      ('lanes3', ['--concurrent_clients=3']),
                      ('two', ['--workers=2'])]:  # implies --backend=cpp
    res = subprocess.run(base + [f'--experiment_name={name}', *extra], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    from tff_algos import training
    rows[name] = training.read_metrics(os.path.join(tmp_path, name, 'metrics.csv'))
  bad = subprocess.run(base + ['--backend=inprocess', '--workers=2'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert bad.returncode != 0 and 'not --backend=inprocess' in bad.stderr + bad.stdout
  bad = subprocess.run(base + ['--backend=cpp', '--concurrent_clients=2'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert bad.returncode != 0 and 'for --backend=inprocess' in bad.stderr + bad.stdout
  with open(os.path.join(tmp_path, 'lanes3', 'summary.json')) as f:
    assert json.load(f)['flags']['effective_concurrent_clients'] == 3
  with open(os.path.join(tmp_path, 'inprocess', 'summary.json')) as f:
    flags = json.load(f)['flags']
  assert flags['concurrent_clients'] is None
  from tff_algos.runtime import inprocess
  assert flags['effective_concurrent_clients'] == inprocess.effective_concurrent_clients()
  with open(os.path.join(tmp_path, 'cpp', 'summary.json')) as f:
    assert 'effective_concurrent_clients' not in json.load(f)['flags']
  for name in ('inprocess', 'lanes3', 'two'):
    assert len(rows[name]) == len(rows['cpp']) == 2
    for a, b in zip(rows[name], rows['cpp']):
      for key, value in b.items():
        if isinstance(value, float) and 'time' not in key and 'seconds' not in key:
          assert a[key] == pytest.approx(value, abs=1e-5), (name, key)


def test_unreachable_worker_address_fails_clearly():
  port = portpicker.pick_unused_port()
  with pytest.raises(RuntimeError, match=f'no TFF worker answers at localhost:{port}'):
    runtime.context.wait_ready(f'localhost:{port}', timeout_s=1.0)


def test_seeded_dropout_keeps_one_lane_and_the_one_lane_model(task, client_data):
  """A seeded stateful random op (Dropout with an op seed) continues one stream
  per import across clients: such client work gets one lane, so
  `concurrent_clients` cannot change the model. Seeded Keras initialisers
  (set_random_seed; overwritten by the server's weights) do not count."""
  from tasks import base
  from tff_algos.runtime import inprocess
  functions = []

  def model_fn(dropout):
    def keras():
      layers = [tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(16, activation='relu')]
      layers += [tf.keras.layers.Dropout(0.5, seed=7)] if dropout else []
      return tf.keras.Sequential(layers + [tf.keras.layers.Dense(10)])
    return base.keras_model_fn(
        keras, client_data[0].element_spec,
        lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), lambda: [])

  results = {}
  for dropout in (False, True):
    tf.keras.utils.set_random_seed(3)
    process = fedopt.build_fedopt(model_fn(dropout), fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=3)).process
    for lanes in (1, 3):
      functions.clear()
      results[dropout, lanes] = run_rounds(
          process, client_data, 2, inprocess.create_context(
              concurrent_clients=lanes, on_new_function=functions.append))[0]
      training = [f for f in functions if f.takes_datasets]
      assert [f.seeded_random for f in training] == [dropout]
      assert len(training[0].imports) == (1 if dropout or lanes == 1 else 3)
  assert_same(results[True, 3], results[True, 1], atol=0)
  assert_same(results[False, 3], results[False, 1])


def test_inprocess_results_are_read_only_views_fed_back_without_copies(task, client_data):
  """A result is a read-only array over its tensor's own buffer, and fed back
  (the next round's state) it is that tensor again: no copy either way."""
  import gc
  from tensorflow_federated.python.core.impl.types import computation_types
  from tff_algos.runtime import inprocess
  from tff_algos.runtime.inprocess import values
  spec = computation_types.TensorType(np.float32, [2, 3])
  tensor = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
  array = values.materialise(tensor)
  np.testing.assert_array_equal(array, tensor.numpy())
  assert not array.flags.writeable
  with pytest.raises(ValueError, match='read-only'):
    array[0, 0] = 7.0
  assert values.ingest(array, spec) is tensor
  copy = array.copy()  # not a result: converted as before
  assert copy.flags.writeable and values.ingest(copy, spec) is not tensor
  np.testing.assert_array_equal(values.ingest(copy, spec), tensor)
  as_float64 = values.ingest(array, computation_types.TensorType(np.float64, [2, 3]))
  assert as_float64.dtype == tf.float64  # another dtype: converted
  assert values.materialise(tf.constant(2.5)) == np.float32(2.5)  # scalars as numpy()
  # Its entry goes with it. (Not a count: a collection also frees earlier
  # tests' arrays, which made the count flaky.)
  key = id(array)
  assert values._SHOWN[key][0]() is array  # pylint: disable=protected-access
  del array
  gc.collect()
  assert key not in values._SHOWN  # pylint: disable=protected-access
  # A learning process's rounds on such state equal rounds on copied state.
  ctx = inprocess.create_context()
  process = fedavg(task).process
  with context_stack_impl.context_stack.install(ctx):
    state = process.initialize()
    arrays = [a for a in tf.nest.flatten(state) if isinstance(a, np.ndarray) and a.ndim]
    assert arrays and not any(a.flags.writeable for a in arrays)
    fed_back = process.next(process.next(state, client_data).state, client_data).state
    copied = process.next(tf.nest.map_structure(np.copy, process.next(
        state, client_data).state), client_data).state
  for x, y in zip(leaves(fed_back), leaves(copied), strict=True):
    np.testing.assert_array_equal(x, y)


def _assert_identical(a, b, path='result'):
  """Same Python containers (types, keys, order) and bit-equal arrays."""
  import attr
  assert type(a) is type(b), f'{path}: {type(a).__name__} vs {type(b).__name__}'
  if isinstance(a, dict):
    assert list(a) == list(b), path
    for k in a:
      _assert_identical(a[k], b[k], f'{path}[{k!r}]')
  elif attr.has(type(a)):
    for f in attr.fields(type(a)):
      _assert_identical(getattr(a, f.name), getattr(b, f.name), f'{path}.{f.name}')
  elif isinstance(a, (list, tuple)):
    assert len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _assert_identical(x, y, f'{path}[{i}]')
  else:
    assert np.asarray(a).dtype == np.asarray(b).dtype, path
    np.testing.assert_array_equal(a, b, err_msg=path)


@pytest.mark.parametrize('name', ['fedavg', 'scaffold', 'mimelite'])
def test_inprocess_direct_calls_give_what_tffs_context_gives(task, client_data, name,
                                                            monkeypatch):
  """`InProcessContext` calls the executor with one ingestion and converters
  built per result type; TFF's context path (which it still takes for what it
  cannot ingest) must give the same Python values:
  containers, names, dtypes and bits, for a round's state, metrics and client
  states, `initialize` and `get_model_weights`."""
  from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
  from tff_algos.runtime import inprocess
  hp = (HParams(client_optimizer='adam', client_learning_rate=0.01, local_steps=2)
        if name == 'mimelite' else HParams(local_steps=2))
  algorithm = algorithm_flags.build(name, task.model_fn, hp)
  process, stateful = algorithm.process, getattr(algorithm, 'stateful_clients', False)
  ctx = inprocess.create_context()
  assert isinstance(ctx, inprocess.InProcessContext)

  tff_invoke, fallbacks = sync_execution_context.SyncExecutionContext.invoke, []

  def counted(self, comp, arg):
    fallbacks.append(comp)
    return tff_invoke(self, comp, arg)
  monkeypatch.setattr(sync_execution_context.SyncExecutionContext, 'invoke', counted)
  tffs_way = lambda comp, arg: tff_invoke(ctx, comp, arg)  # noqa: E731
  with context_stack_impl.context_stack.install(ctx):
    direct = (run_rounds(process, client_data, 2, stateful=stateful),
              process.get_model_weights(process.initialize() if not stateful else
                                        process.initialize(stateful_process.Population(20, 30.))))
    assert not fallbacks  # every call above went the direct way
    ctx.invoke = tffs_way
    tff_path = (run_rounds(process, client_data, 2, stateful=stateful),
                process.get_model_weights(process.initialize() if not stateful else
                                          process.initialize(stateful_process.Population(20, 30.))))
  _assert_identical(direct, tff_path)


def test_inprocess_direct_calls_convert_like_tff():
  """Arguments of another dtype are converted as TFF's context converts them,
  and an argument the interpreter cannot ingest takes TFF's path (its error)."""
  from tff_algos.runtime import inprocess
  ctx = inprocess.create_context()

  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  @tff.tensorflow.computation(tff.SequenceType(np.float32))
  def total(ds):
    return ds.reduce(np.float32(0.0), lambda a, b: a + b)

  with context_stack_impl.context_stack.install(ctx):
    got = double(tf.constant(1.25, tf.float64))
    assert got.dtype == np.float32 and got == 2.5
    assert total(tf.data.Dataset.from_tensor_slices([1.0, 2.0])) == 3.0
    with pytest.raises(TypeError, match='tf.data.Dataset'):
      total([1.0, 2.0])


def test_inprocess_named_arguments_are_read_by_name_and_mismatches_refused():
  """Named containers are read by name, whatever their order; a missing, extra
  or surplus element, or None for a tensor, raises instead of being matched by
  position, dropped or read as nan."""
  import collections
  from tensorflow_federated.python.common_libs import structure
  from tff_algos.runtime import inprocess
  ctx = inprocess.create_context()

  @tff.tensorflow.computation(tff.StructType([('a', np.float32), ('b', np.float32)]))
  def a_minus_b(s):
    return s['a'] - s['b']

  @tff.tensorflow.computation(np.float32, np.float32)
  def first_minus_second(x, y):
    return x - y

  swapped = collections.namedtuple('Swapped', ['b', 'a'])
  with context_stack_impl.context_stack.install(ctx):
    for arg in ({'a': 5.0, 'b': 1.0}, {'b': 1.0, 'a': 5.0}, swapped(b=1.0, a=5.0),
                structure.Struct([('b', 1.0), ('a', 5.0)]), (5.0, 1.0)):
      assert a_minus_b(arg) == 4.0, arg
    for arg in ({'a': 5.0}, {'a': 5.0, 'b': 1.0, 'c': 0.0}, (5.0, 1.0, 100.0), (5.0,),
                {'a': 5.0, 'b': None}):
      with pytest.raises((TypeError, IndexError)):  # IndexError: TFF's own, for too few
        a_minus_b(arg)
    assert first_minus_second(5.0, 1.0) == 4.0


def test_inprocess_calls_in_graph_mode_take_tffs_way():
  """A call made while a graph is being built (a `tf.Graph` or a `tf.function`)
  runs eagerly on TFF's loop thread, as on TFF's path, also after quick calls."""
  from tff_algos.runtime import inprocess
  ctx = inprocess.create_context()

  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  with context_stack_impl.context_stack.install(ctx):
    assert [double(np.float32(k)) for k in range(3)] == [0.0, 2.0, 4.0]  # now quick
    with tf.Graph().as_default():
      assert double(np.float32(3.0)) == 6.0
    assert tf.function(lambda: double(np.float32(3.0)))() == 6.0


def test_inprocess_threads_mixing_tffs_way_and_the_loop_thread_do_not_deadlock(monkeypatch):
  """One thread's calls take TFF's way (an argument the interpreter refuses),
  another's run on TFF's loop thread: the loop thread must never wait for the
  lock that a stalled coroutine of TFF's way holds (they deadlocked)."""
  import threading
  import time
  from tff_algos.runtime import inprocess
  ctx = inprocess.create_context()
  monkeypatch.setattr(ctx, 'QUICK_CALL_SECONDS', 0.0)  # every call on the loop thread

  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  @tff.tensorflow.computation(tff.SequenceType(np.float32), np.float32)
  def total_plus(ds, x):
    return ds.reduce(np.float32(0.0), lambda a, b: a + b) + x

  counts, errors = [0, 0], []

  def repeat(i, call):
    try:
      with context_stack_impl.context_stack.install(ctx):
        while counts[i] < 30:
          call()
          counts[i] += 1
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  def refused():
    with pytest.raises(TypeError):
      total_plus([1.0, 2.0], 1.0)  # a list, not a dataset: TFF's way

  def looped():
    assert double(np.float32(1.0)) == 2.0

  threads = [threading.Thread(target=repeat, args=(i, f), daemon=True)
             for i, f in enumerate((refused, looped))]
  for t in threads:
    t.start()
  deadline = time.monotonic() + 120
  for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
  assert not any(t.is_alive() for t in threads), f'deadlocked after {counts}'
  assert not errors and counts == [30, 30]


def test_inprocess_quick_calls_run_on_the_calling_thread_others_on_tffs(monkeypatch):
  """A computation's first call (it traces) and calls after one that took
  `QUICK_CALL_SECONDS` or more run on TFF's event-loop thread, so the main
  thread takes signals while it waits; calls after a quick one run here."""
  import threading
  from tff_algos.runtime import inprocess
  ctx = inprocess.create_context()
  threads = []
  call = inprocess.InProcessContext._call

  def recorded(self, *args):
    threads.append(threading.current_thread() is threading.main_thread())
    return call(self, *args)
  monkeypatch.setattr(inprocess.InProcessContext, '_call', recorded)

  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  # Quick: anything under a minute, so that a loaded machine cannot flip it.
  monkeypatch.setattr(inprocess.InProcessContext, 'QUICK_CALL_SECONDS', 60.0)
  with context_stack_impl.context_stack.install(ctx):
    assert [double(np.float32(k)) for k in range(3)] == [0.0, 2.0, 4.0]
    assert threads == [False, True, True]
    monkeypatch.setattr(inprocess.InProcessContext, 'QUICK_CALL_SECONDS', 0.0)
    assert double(np.float32(4.0)) == 8.0
    assert threads[-1] is False


def test_inprocess_a_call_interrupted_while_it_runs_on_the_loop_thread_keeps_the_lock(
    monkeypatch):
  """Ctrl-C in a notebook stops the wait for a call on TFF's loop thread, not
  the call: the next call must wait until it is over instead of running
  beside it (the lock was released at once). Simulated: the waiting thread
  gets a KeyboardInterrupt while the call goes on, blocked on an event."""
  import threading
  import time
  from tff_algos.runtime import inprocess
  ctx = inprocess.create_context()
  monkeypatch.setattr(ctx, 'QUICK_CALL_SECONDS', 60.0)  # calls after the first are quick

  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  @tff.tensorflow.computation(np.float32)
  def slow(x):
    return x + 1.0

  events, release = [], threading.Event()
  call = inprocess.InProcessContext._call

  def recorded(self, comp, *args):
    name = 'slow' if comp is slow else 'double'
    events.append(('start', name))
    if name == 'slow':
      assert release.wait(60)
    try:
      return call(self, comp, *args)
    finally:
      events.append(('end', name))
  monkeypatch.setattr(inprocess.InProcessContext, '_call', recorded)

  class Interrupted:
    """The loop thread runs the call; the waiting thread is interrupted."""

    def __init__(self, runner):
      self.runner = runner

    def run_coro_and_return_result(self, coroutine):
      threading.Thread(target=self.runner.run_coro_and_return_result, args=(coroutine,),
                       daemon=True).start()
      time.sleep(0.2)
      raise KeyboardInterrupt

  with context_stack_impl.context_stack.install(ctx):
    assert double(np.float32(1.0)) == 2.0  # first call: on the loop thread
    runner = ctx._async_runner._runner  # pylint: disable=protected-access
    monkeypatch.setattr(ctx._async_runner, '_runner', Interrupted(runner))  # pylint: disable=protected-access
    with pytest.raises(KeyboardInterrupt):
      slow(np.float32(1.0))  # its first call: on the loop thread, still running
    monkeypatch.setattr(ctx._async_runner, '_runner', runner)  # pylint: disable=protected-access
    results = []
    second = threading.Thread(target=_in_context, args=(ctx, double, results), daemon=True)
    second.start()
    time.sleep(0.5)
    assert events == [('start', 'double'), ('end', 'double'), ('start', 'slow')]
    release.set()
    second.join(60)
    assert results == [6.0]
    assert events[3:] == [('end', 'slow'), ('start', 'double'), ('end', 'double')]
    assert double(np.float32(4.0)) == 8.0  # the lock is free again


@pytest.mark.filterwarnings('ignore:coroutine .* was never awaited:RuntimeWarning')  # scheduled=False
@pytest.mark.parametrize('scheduled', [False, True])
def test_inprocess_a_call_given_up_before_it_started_never_runs_and_frees_the_lock(
    monkeypatch, scheduled):
  """Ctrl-C while the call is handed to TFF's loop thread: either it never got
  there (`scheduled=False`: the hand-over raised), or it waits there behind
  other work and starts after the waiting thread gave up. Either way the lock
  is free at once (it stayed held for ever when the hand-over raised), the
  call never runs, and nothing is counted as running on the loop thread."""
  import asyncio
  import threading
  import time
  from tff_algos.runtime import inprocess
  from tff_algos.runtime.inprocess import executor
  ctx = inprocess.create_context()
  monkeypatch.setattr(ctx, 'QUICK_CALL_SECONDS', 60.0)

  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  @tff.tensorflow.computation(np.float32)
  def never(x):
    return x + 1.0

  calls = []
  call = inprocess.InProcessContext._call

  def recorded(self, comp, *args):
    calls.append('never' if comp is never else 'double')
    return call(self, comp, *args)
  monkeypatch.setattr(inprocess.InProcessContext, '_call', recorded)
  loop = asyncio.new_event_loop()
  loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
  loop_thread.start()
  busy = threading.Event()
  handed = []

  class Interrupted:
    """The hand-over is interrupted before the coroutine was scheduled, or
    after it was queued behind a callback that keeps the loop busy."""

    def run_coro_and_return_result(self, coroutine):
      if scheduled:
        loop.call_soon_threadsafe(busy.wait, 60)
        handed.append(asyncio.run_coroutine_threadsafe(coroutine, loop))
      raise KeyboardInterrupt

  with context_stack_impl.context_stack.install(ctx):
    assert double(np.float32(1.0)) == 2.0
    runner = ctx._async_runner._runner  # pylint: disable=protected-access
    monkeypatch.setattr(ctx._async_runner, '_runner', Interrupted())  # pylint: disable=protected-access
    with pytest.raises(KeyboardInterrupt):
      never(np.float32(1.0))  # its first call: handed to the loop thread
    assert executor.calls_on_loop_threads() == 0
    monkeypatch.setattr(ctx._async_runner, '_runner', runner)  # pylint: disable=protected-access
    results = []
    second = threading.Thread(target=_in_context, args=(ctx, double, results), daemon=True)
    second.start()
    second.join(30)
    assert results == [6.0]  # the lock was free
    busy.set()
    if scheduled:
      assert handed[0].result(30) is None  # it ended without running the call
    time.sleep(0.1)
    assert calls == ['double', 'double']
    assert executor.calls_on_loop_threads() == 0
  loop.call_soon_threadsafe(loop.stop)
  loop_thread.join(10)


def _in_context(ctx, computation, results):
  with context_stack_impl.context_stack.install(ctx):
    results.append(computation(np.float32(3.0)))
