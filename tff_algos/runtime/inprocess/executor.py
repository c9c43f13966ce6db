"""The interpreter as a TFF executor, and the sync TFF context built on it."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import threading
import time
from typing import Any, Callable, Optional

import attr
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2 as pb
from tensorflow_federated.python.common_libs import py_typecheck
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_tree_transformations
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.compiler import building_blocks as bb
from tensorflow_federated.python.core.impl.compiler import transformations
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import cardinalities_utils
from tensorflow_federated.python.core.impl.executors import executor_base
from tensorflow_federated.python.core.impl.executors import executor_value_base
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_algos.runtime import backend_options
from tff_algos.runtime.inprocess import values
from tff_algos.runtime.inprocess.interpreter import Interpreter
from tff_algos.runtime.inprocess.tensorflow_function import TensorFlowFunction
from tff_algos.runtime.inprocess.tracing import WholeCallTracer


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
    return values.materialise(self._value)


class InProcessExecutor(executor_base.Executor):
  """Interprets natively compiled TFF computations in this Python process."""

  def __init__(self, num_clients: int, devices: list[str], cache: dict,
               host_datasets: bool = False, lanes: int = 1,
               on_new_function: Optional[Callable[[TensorFlowFunction], None]] = None):
    # Building blocks and imported TF functions are shared by all cohort sizes.
    self._blocks = cache.setdefault('computations', {})
    self._interpreter = Interpreter(num_clients, devices, cache.setdefault('tf', {}),
                                    host_datasets, lanes, on_new_function)
    self._tracer = cache.setdefault('traced', WholeCallTracer(host_datasets))

  def close(self):
    pass

  async def create_value(self, value, type_spec=None):
    if isinstance(value, (computation_impl.ConcreteComputation, pb.Computation)):
      block = self._block(value)
      return _Value(self._interpreter.eval(block, None), type_spec,
                    block if isinstance(block, bb.Lambda) else None)
    return _Value(values.ingest(value, type_spec), type_spec)

  def _block(self, comp):
    key = id(comp)
    entry = self._blocks.get(key)
    if entry is None or entry[0] is not comp:
      proto = (comp if isinstance(comp, pb.Computation)
               else computation_impl.ConcreteComputation.get_proto(comp))
      entry = (comp, bb.ComputationBuildingBlock.from_proto(proto))
      self._blocks[key] = entry
    return entry[1]

  async def create_call(self, comp, arg=None):
    fn = comp.reference
    interpret = lambda a: fn() if a is None else fn(a)
    arg = None if arg is None else arg.reference
    if comp.block is not None:  # a whole computation: one traced TensorFlow call
      result = self._tracer.call(self._interpreter, comp.block, arg, interpret)
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
  with a GPU, computations that take datasets get (1)
  (`graph_surgery.inline_function_calls`).
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
  backend_options.check_concurrent_clients(concurrent_clients)
  return concurrent_clients


def create_context(devices: Optional[list[str]] = None,
                   host_datasets: Optional[bool] = None,
                   concurrent_clients: Optional[int] = None,
                   on_new_function: Optional[Callable[[TensorFlowFunction], None]] = None):
  """A sync TFF context running everything in this process (GPU if visible).

  `host_datasets` (default: when TensorFlow sees a GPU) keeps datasets on the
  host: computations that take datasets (client training) get TFF's static
  function inlining and run as their own calls, one per client, rather than
  inside a traced round (see `graph_surgery.inline_function_calls`).

  `concurrent_clients` (default `default_concurrent_clients`): how many
  clients of a round train at once on each device, each on an import of the
  client computation of its own (its own variables). Results do not depend on
  it (tests/test_backends.py).

  `on_new_function`, if given, is called with every TensorFlow computation the
  context imports (a `TensorFlowFunction`), e.g. to inspect its lanes.
  """
  gpus = gpu_devices()
  devices = gpus if devices is None else devices
  host_datasets = bool(gpus) if host_datasets is None else host_datasets
  lanes = effective_concurrent_clients(concurrent_clients, host_datasets)
  cache: dict = {}

  def stack_fn(cardinalities):
    return InProcessExecutor(cardinalities.get(tff.CLIENTS, 0), devices, cache,
                             host_datasets, lanes, on_new_function)

  return InProcessContext(python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=stack_fn))


class _IdentityCachedCompiler:
  """`compiler_fn` cached by its argument's identity (the argument is kept, so
  its id is not reused), at most `MAX_ENTRIES` arguments: computations for the
  compiler and for `InProcessContext`'s call timings, result types for its
  container converters."""

  MAX_ENTRIES = 256

  def __init__(self, compiler_fn):
    self._compiler_fn = compiler_fn
    self._compiled: dict[int, tuple[Any, Any]] = {}

  def compile(self, comp):
    entry = self._compiled.get(id(comp))
    if entry is None or entry[0] is not comp:
      if len(self._compiled) >= self.MAX_ENTRIES:
        self._compiled.pop(next(iter(self._compiled)), None)  # the oldest (None: raced)
      entry = (comp, self._compiler_fn(comp))
      self._compiled[id(comp)] = entry
    return entry[1]


# Calls handed to a TFF event-loop thread (a daemon) that have not returned.
_calls_on_loop_threads = 0
_calls_lock = threading.Lock()


def calls_on_loop_threads() -> int:
  """How many in-process calls run (or wait to run) on TFF's event-loop threads.

  A Ctrl-C or SIGTERM stops the thread that waits for such a call, not the
  call: its TensorFlow work goes on, and an interpreter that tears itself down
  under it crashes (SIGSEGV in a running kernel; "terminate called ..." and
  Python's fatal-error dump while it traces). `experiments.lib.common.run` then
  ends the process at once instead (`os._exit`).
  """
  return _calls_on_loop_threads


def _count_calls_on_loop_threads(change: int) -> None:
  global _calls_on_loop_threads
  with _calls_lock:
    _calls_on_loop_threads += change


class _Handover:
  """A call handed to TFF's loop thread, and who releases the context's lock
  after it: the waiting thread, or, when that thread stopped waiting (Ctrl-C)
  while the call ran, the loop thread once the call is over. A call given up
  before it started never starts (the waiting thread releases the lock): the
  loop thread may never have got it (the hand-over itself was interrupted, or
  the loop is closed), and a call that starts later would run beside the next.
  Each step decides under one guard, and the call is counted
  (`calls_on_loop_threads`) from the hand-over until it is over or given up.
  """

  def __init__(self, lock: threading.Lock):
    self._lock, self._guard = lock, threading.Lock()
    self._state = 'handed'  # -> 'running' -> 'over', or 'handed' -> 'dropped'
    self._abandoned = False
    _count_calls_on_loop_threads(+1)

  def start(self) -> bool:
    """On the loop thread, before the call: False if it was given up."""
    with self._guard:
      if self._state == 'dropped':
        return False
      self._state = 'running'
      return True

  def over(self) -> None:
    """On the loop thread, the call ended: release the lock if nobody waits."""
    with self._guard:
      self._state = 'over'
      _count_calls_on_loop_threads(-1)
      if self._abandoned:
        self._lock.release()

  def abandon(self) -> bool:
    """The waiting thread stops waiting: True if the loop thread will release."""
    with self._guard:
      if self._state == 'handed':
        self._state = 'dropped'
        _count_calls_on_loop_threads(-1)
      self._abandoned = self._state == 'running'
      return self._abandoned


class _CountingRunner:
  """TFF's `AsyncThreadRunner`, counting what it runs (`calls_on_loop_threads`).

  A call it runs holds the context's lock (`lock`, taken by the calling
  thread) until it is over, also when the calling thread stops waiting for it:
  a Ctrl-C in a notebook stops the wait, not the TensorFlow call, and the next
  call would otherwise run beside it. `handed_over()` tells the calling thread
  that the loop thread releases the lock (per thread: once released, another
  thread's call may begin before this one has read it).
  """

  def __init__(self, runner, lock: threading.Lock):
    self._runner, self._lock = runner, lock
    self._thread = threading.local()

  def handed_over(self) -> bool:
    """Whether this thread's last call on the loop thread keeps the lock."""
    return getattr(self._thread, 'handed_over', False)

  def forget_handover(self) -> None:
    self._thread.handed_over = False

  def run_coro_and_return_result(self, coroutine):
    handover = None
    try:
      handover = _Handover(self._lock)
      return self._runner.run_coro_and_return_result(self._counted(coroutine, handover))
    except BaseException:
      self._thread.handed_over = handover is not None and handover.abandon()
      raise

  @staticmethod
  async def _counted(coroutine, handover: _Handover):
    if not handover.start():  # given up before it began: nobody waits for it
      coroutine.close()
      return None
    try:
      return await coroutine
    finally:  # on the loop thread, once the call is over
      handover.over()


class InProcessContext(sync_execution_context.SyncExecutionContext):
  """TFF's sync context over `InProcessExecutor`, calling the executor directly.

  TFF's context runs each call as a coroutine on an event-loop thread: the
  arguments converted to numpy, ingested one structure element at a time, the
  result converted to Python containers by walking its type
  (`type_to_py_container`, with runtime `Protocol` checks) and to numpy again.
  Here a call whose argument the interpreter can ingest takes a shorter way:
  `values.ingest` of the whole argument, the executor's (synchronous)
  coroutines driven directly, and a converter built once per result type
  (`_container_converter`). Measured on the trainer's quadratic-toy round
  (docs/performance.md): ~1 ms of Python a round less. Anything else (a
  coroutine argument, a call made while a graph is built, a value
  `values.ingest` does not take) goes TFF's way, which also gives its errors.
  Calls run one at a time: the calling thread holds a lock for the whole call,
  also while it waits for the loop thread, which never waits for the lock. A
  call that the calling thread stops waiting for (Ctrl-C in a notebook) keeps
  the lock until it is over, so that the next call waits for it.

  A computation whose last call took under `QUICK_CALL_SECONDS` runs on the
  calling thread; others (first calls, which trace, and long rounds) run on
  TFF's event-loop thread while the calling thread waits, so that Ctrl-C and
  SIGTERM reach a run's handlers at once rather than when the round's
  TensorFlow call returns (Python runs signal handlers between bytecodes of
  the main thread only).

  Computations are compiled once and looked up by identity: TFF's pipeline
  caches compilations by `hash(comp)`, which serializes the whole computation
  on every call (0.2 ms for the quadratic toy's round, 0.4 ms for the EMNIST
  CNN's).
  """

  QUICK_CALL_SECONDS = 0.05  # a Ctrl-C waits at most about this long

  def __init__(self, executor_factory):
    super().__init__(executor_fn=executor_factory, compiler_fn=compile_for_inprocess,
                     transform_args=tensorflow_computation.transform_args,
                     transform_result=tensorflow_computation.transform_result)
    self._compiler = _IdentityCachedCompiler(compile_for_inprocess)
    async_context = self._async_context  # pylint: disable=protected-access
    assert hasattr(async_context, '_compiler_pipeline'), 'TFF changed its context'
    async_context._compiler_pipeline = self._compiler  # pylint: disable=protected-access
    self._converters = _IdentityCachedCompiler(_container_converter)  # per result type
    # Per computation, [its last call's seconds] (inf: not called yet).
    self._last_seconds = _IdentityCachedCompiler(lambda _: [math.inf])
    self._lock = threading.Lock()  # calls one at a time, as on TFF's one loop thread
    # TFF's way counted too; calls on the loop thread hand the lock over.
    self._async_runner = _CountingRunner(self._async_runner, self._lock)

  def invoke(self, comp, arg):
    # The lock is always taken by the calling thread, never by TFF's loop
    # thread: a loop thread waiting for it would stall a coroutine of TFF's
    # way that holds it (measured: two threads deadlocked within 2 s).
    if asyncio.iscoroutine(arg) or not tf.executing_eagerly():
      return self._tffs_way(comp, arg)  # in graph mode it runs eagerly on its loop thread
    compiled = self._compiler.compile(comp)
    parameter_type = compiled.type_signature.parameter
    try:
      ingested = None if arg is None else _Value(values.ingest(arg, parameter_type),
                                                 parameter_type)
      cardinalities = ({} if arg is None else
                       cardinalities_utils.infer_cardinalities(arg, parameter_type))
    except Exception:  # pylint: disable=broad-except
      return self._tffs_way(comp, arg)  # its conversions, its errors
    last_seconds = self._last_seconds.compile(comp)
    with self._one_call():
      if last_seconds[0] < self.QUICK_CALL_SECONDS:
        return self._call(comp, compiled, ingested, cardinalities, last_seconds)

      async def on_loop_thread():
        return self._call(comp, compiled, ingested, cardinalities, last_seconds)
      return self._async_runner.run_coro_and_return_result(on_loop_thread())

  def _tffs_way(self, comp, arg):
    """TFF's context's own path, one call at a time like the others."""
    with self._one_call():
      return super().invoke(comp, arg)

  @contextlib.contextmanager
  def _one_call(self):
    """Holds the lock for one call; released here unless a call on the loop
    thread that this thread stopped waiting for still runs (it releases it)."""
    self._lock.acquire()
    try:
      self._async_runner.forget_handover()
      yield
    finally:
      if not self._async_runner.handed_over():
        self._lock.release()

  def _call(self, comp, compiled, ingested, cardinalities, last_seconds: list):
    """One call (the caller holds the lock); its seconds go to `last_seconds`."""
    started = time.perf_counter()
    executor = self.executor_factory.create_executor(cardinalities)
    try:
      fn = _drive(executor.create_value(compiled, compiled.type_signature))
      result = _drive(_drive(executor.create_call(fn, ingested)).compute())
    except Exception:
      self.executor_factory.clean_up_executor(cardinalities)  # as TFF's context
      raise
    last_seconds[0] = time.perf_counter() - started
    return self._converters.compile(comp.type_signature.result)(result)


def _drive(coroutine):
  """The result of a coroutine that never waits (the executor's)."""
  try:
    coroutine.send(None)
  except StopIteration as stop:
    return stop.value
  coroutine.close()
  raise RuntimeError('In-process backend: an executor coroutine waited.')


def _container_converter(type_spec) -> Callable[[Any], Any]:
  """`type_conversions.type_to_py_container(·, type_spec)`, built once per type.

  The same containers; where TFF's function would raise or treats a value
  specially (sequences, mixed names, a mismatched length), the converter calls
  it. Element names are those of `type_spec`: the interpreter's results are
  built from the computation's own type, so TFF's name check is not repeated.
  """
  def tff_way(value):
    return type_conversions.type_to_py_container(value, type_spec)

  if isinstance(type_spec, computation_types.FederatedType):
    member = _container_converter(type_spec.member)
    if type_spec.all_equal:
      return member
    return lambda value: ([member(v) for v in value] if isinstance(value, list)
                          else tff_way(value))
  if isinstance(type_spec, computation_types.SequenceType):
    return tff_way
  if not isinstance(type_spec, computation_types.StructType):
    return lambda value: value
  names = [name for name, _ in structure.iter_elements(type_spec)]
  children = [_container_converter(t) for _, t in structure.iter_elements(type_spec)]
  named = sum(name is not None for name in names)
  container = getattr(type_spec, 'python_container', None)
  if container is None:
    container = collections.OrderedDict if named else tuple
  if (0 < named < len(names)) or (named and issubclass(container, (list, tuple)) and
                                  not isinstance(container, py_typecheck.SupportsNamedTuple)):
    return tff_way  # TFF raises
  size = len(names)
  by_keywords = (isinstance(container, py_typecheck.SupportsNamedTuple)
                 or attr.has(container))

  def convert(value):
    if not isinstance(value, structure.Struct):
      return value  # as TFF: taken to be converted already
    if len(value) != size:
      return tff_way(value)
    elements = [child(value[i]) for i, child in enumerate(children)]
    if by_keywords:
      return container(**dict(zip(names, elements)))
    return container(zip(names, elements) if named else elements)
  return convert
