"""The interpreter as a TFF executor, and the sync TFF context built on it."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2 as pb
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_tree_transformations
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.compiler import building_blocks as bb
from tensorflow_federated.python.core.impl.compiler import transformations
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import executor_base
from tensorflow_federated.python.core.impl.executors import executor_value_base
from tensorflow_federated.python.core.impl.types import computation_types

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

  context = sync_execution_context.SyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
          executor_stack_fn=stack_fn),
      compiler_fn=compile_for_inprocess,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
  # TFF's pipeline caches compilations by `hash(comp)`, which serializes the
  # whole computation on every call (0.2 ms for the quadratic toy's round, 0.4
  # ms for the EMNIST CNN's); this one looks computations up by identity first.
  async_context = context._async_context  # pylint: disable=protected-access
  assert hasattr(async_context, '_compiler_pipeline'), 'TFF changed its context'
  async_context._compiler_pipeline = _IdentityCachedCompiler(compile_for_inprocess)  # pylint: disable=protected-access
  return context


class _IdentityCachedCompiler:
  """`compiler_fn` cached by the computation's identity (the computation is
  kept, so its id is not reused), at most `MAX_ENTRIES` computations."""

  MAX_ENTRIES = 256

  def __init__(self, compiler_fn):
    self._compiler_fn = compiler_fn
    self._compiled: dict[int, tuple[Any, Any]] = {}

  def compile(self, comp):
    entry = self._compiled.get(id(comp))
    if entry is None or entry[0] is not comp:
      if len(self._compiled) >= self.MAX_ENTRIES:
        self._compiled.pop(next(iter(self._compiled)))  # the oldest
      entry = (comp, self._compiler_fn(comp))
      self._compiled[id(comp)] = entry
    return entry[1]
