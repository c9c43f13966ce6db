"""Rewrites of TensorFlow graph definitions before they are imported.

Pure functions of a `GraphDef` (or of a compiled building block): no
TensorFlow runtime state is touched.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow_federated.python.core.environments.tensorflow_backend import compiled_computation_transformations
from tensorflow_federated.python.core.impl.compiler import building_blocks as bb


def rename_functions(graph_def, suffix: str) -> None:
  """Appends `_suffix` to every function of the graph's library, and to its uses.

  Function names are global in the eager context: equal names of different
  graphs (e.g. `__inference_..._155`) must not clash.
  """
  names = {f.signature.name: f'{f.signature.name}_{suffix}'
           for f in graph_def.library.function}
  if not names:
    return

  def rename_in_attr(attr):
    if attr.HasField('func') and attr.func.name in names:
      attr.func.name = names[attr.func.name]
    for f in attr.list.func:
      if f.name in names:
        f.name = names[f.name]

  def rename_in_nodes(nodes):
    for node in nodes:
      if node.op in names:
        node.op = names[node.op]
      for attr in node.attr.values():
        rename_in_attr(attr)

  rename_in_nodes(graph_def.node)
  for f in graph_def.library.function:
    f.signature.name = names[f.signature.name]
    rename_in_nodes(f.node_def)
    for attr in f.attr.values():
      rename_in_attr(attr)
  for g in graph_def.library.gradient:
    g.function_name = names.get(g.function_name, g.function_name)
    g.gradient_func = names.get(g.gradient_func, g.gradient_func)


def is_input_pipeline_op(op: str) -> bool:
  """Whether an op type is a dataset, iterator or optional op."""
  return 'Dataset' in op or 'Iterator' in op or op.startswith('Optional')


def pin_input_pipeline_to_cpu(graph_def) -> None:
  """Dataset, iterator and optional ops (in the graph and its functions) on the CPU.

  TFF serialises graphs without device annotations, and with a GPU TensorFlow
  2.14 placed iterators created in a tf.cond branch on the GPU, where using
  them crashed the process (segfault).
  """
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  for node in nodes:
    if is_input_pipeline_op(node.op):
      node.device = '/device:CPU:0'


STATEFUL_RANDOM_OPS = frozenset([
    'RandomUniform', 'RandomUniformInt', 'RandomStandardNormal', 'TruncatedNormal',
    'ParameterizedTruncatedNormal', 'RandomShuffle', 'Multinomial', 'RandomGamma',
    'RandomPoisson', 'RandomPoissonV2', 'RandomCrop'])


def _called_functions(node):
  """Names of the functions a node's attributes refer to."""
  for attr in node.attr.values():
    names = [attr.func.name] if attr.HasField('func') else [f.name for f in attr.list.func]
    yield from (n for n in names if n)


def _ops_reaching(graph_def, tensor_names: list[str]) -> list:
  """The graph's nodes the tensors depend on, and every node of the functions
  those nodes call, transitively."""
  nodes = {n.name: n for n in graph_def.node}
  library = {f.signature.name: f for f in graph_def.library.function}
  todo = [name.split(':')[0] for name in tensor_names]
  seen, ops = set(), []
  while todo:
    node = nodes.get(todo.pop())
    if node is None or node.name in seen:
      continue
    seen.add(node.name)
    ops.append(node)
    todo.extend(i.lstrip('^').split(':')[0] for i in node.input)
  done = set()
  functions = [f for op in ops for f in _called_functions(op)]
  while functions:
    name = functions.pop()
    if name in done or name not in library:
      continue
    done.add(name)
    for node in library[name].node_def:
      ops.append(node)
      functions.extend(_called_functions(node))
  return ops


def has_seeded_random_results(graph_def, result_names: list[str]) -> bool:
  """Whether a seeded stateful random op can reach the tensors `result_names`.

  Only the ops the result tensors depend on count: the Keras initialisers,
  which only the `initialize_op` reaches, are overwritten by the server's
  weights. Unseeded ops (seed = seed2 = 0) draw fresh numbers per kernel anyway.
  """
  return any(op.op in STATEFUL_RANDOM_OPS and (op.attr['seed'].i or op.attr['seed2'].i)
             for op in _ops_reaching(graph_def, result_names))


def native_grappler_config() -> tf.compat.v1.ConfigProto:
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


def inline_function_calls(comp: bb.CompiledComputation) -> bb.CompiledComputation:
  """`comp` through TFF's native compiler's static Grappler pass.

  TFF's compiler runs it for GPUs: "The function inlining is critical for GPU
  support, otherwise variant placeholders that received datasets will be placed
  on GPUs which don't have kernels for datasets". The GPU path of this backend
  was verified with it (see the package docstring).
  """
  return compiled_computation_transformations.optimize_tensorflow_comp(
      comp, native_grappler_config())
