"""One import of a TFF TensorFlow computation's graph into this process's TensorFlow."""

from __future__ import annotations

import itertools

import tensorflow as tf
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tff_algos.runtime.inprocess import graph_surgery
from tff_algos.runtime.inprocess import tf_calls

_import_numbers = itertools.count()


def _parameter_names(tf_proto) -> list[str]:
  return (tensorflow_utils.extract_tensor_names_from_binding(tf_proto.parameter)
          if tf_proto.HasField('parameter') else [])


def _prepared_graph_def(tf_proto, suffix: str, host_datasets: bool):
  """The computation's graph with names of its own (`suffix`), its input
  pipeline on the CPU with `host_datasets`."""
  graph_def = serialization_utils.unpack_graph_def(tf_proto.graph_def)
  # Resources (variables) of different imports must not share names.
  graph_def = tensorflow_utils._uniquify_shared_names_with_suffix(  # pylint: disable=protected-access
      graph_def, suffix)
  graph_surgery.rename_functions(graph_def, suffix)
  if host_datasets:
    graph_surgery.pin_input_pipeline_to_cpu(graph_def)
  return graph_def


class GraphImport:
  """One import of a TFF TensorFlow computation's graph, with variables of its own.

  `compute` runs the computation (its parameter tensors and the session token
  in, its result tensors out) and `initialize` its `initialize_op` (None
  without one): functions that calls can be traced into (kept as call ops, see
  `tf_calls.noinline_function`) when `traceable`; otherwise (TensorFlow cannot
  trace a call of the graph, or with `host_datasets`) the pruned graph
  functions themselves, called eagerly.
  """

  def __init__(self, tf_proto, host_datasets: bool):
    suffix = f'inprocess{next(_import_numbers)}'
    graph_def = _prepared_graph_def(tf_proto, suffix, host_datasets)
    param_names = _parameter_names(tf_proto)
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
    feeds = [strings[k] if k in strings else wrapped.graph.as_graph_element(n)
             for k, n in enumerate(param_names)]
    self.dtypes = [t.dtype for t in feeds]
    self.token = self._session_token(tf_proto, wrapped.graph, feeds)
    self.signature = [tf.TensorSpec(t.shape, t.dtype) for t in feeds]
    result_names = tensorflow_utils.extract_tensor_names_from_binding(tf_proto.result)
    self.num_outputs = len(result_names)
    compute = wrapped.prune(feeds, [wrapped.graph.as_graph_element(n) for n in result_names])
    initialize = self._pruned_initialize(tf_proto, wrapped, feeds[len(param_names):])
    self._make_traceable(compute, initialize, host_datasets, len(param_names))

  @staticmethod
  def _session_token(tf_proto, graph, feeds: list):
    """The session token fed to the graph (appended to `feeds`), if it uses one."""
    if tf_proto.session_token_tensor_name:
      token = graph.as_graph_element(tf_proto.session_token_tensor_name)
      if token.consumers():
        feeds.append(token)
        return tf.constant('inprocess')
    return None

  @staticmethod
  def _pruned_initialize(tf_proto, wrapped, feeds: list):
    """The `initialize_op` pruned to a function returning a tensor to order
    later calls after; None without one."""
    if not tf_proto.initialize_op:
      return None
    init_op = wrapped.graph.as_graph_element(tf_proto.initialize_op)
    with wrapped.graph.as_default(), tf.control_dependencies([init_op]):
      done = tf.constant(True)
    return wrapped.prune(feeds, [init_op, done])

  def _make_traceable(self, compute, initialize, host_datasets: bool, num_params: int):
    """Sets `compute`, `initialize` and `traceable` (see the class docstring).

    With host datasets, never traced into other functions: no wrappers."""
    if host_datasets:
      traced_compute = traced_initialize = None
    else:
      traced_compute = tf_calls.noinline_function(compute, self.signature)
      traced_initialize = (None if initialize is None else
                           tf_calls.noinline_function(initialize, self.signature[num_params:]))
    self.traceable = traced_compute is not None and (
        initialize is None or traced_initialize is not None)
    if self.traceable:
      self.compute, self.initialize = traced_compute, traced_initialize
    else:
      self.compute, self.initialize = compute, initialize


# Whether this process imported a computation with a seeded stateful random op
# (`training.initial_model_weights` then re-seeds TensorFlow for every run: the
# kernel cache it clears restarts those ops' streams).
seeded_random_imported = False


def seeded_random_results(tf_proto) -> bool:
  """Whether a seeded stateful random op can reach the computation's results."""
  global seeded_random_imported
  seeded = graph_surgery.has_seeded_random_results(
      serialization_utils.unpack_graph_def(tf_proto.graph_def),
      tensorflow_utils.extract_tensor_names_from_binding(tf_proto.result))
  seeded_random_imported = seeded_random_imported or seeded
  return seeded
