"""Whole calls (e.g. one round of a learning process) traced into one TensorFlow call.

Interpreting a round call by call cost ~10 ms of Python and ~17 TensorFlow
dispatches on FedAvg. Here the interpreter runs once, while a function is
traced: every TensorFlow computation it meets becomes a call op of that
function, federated values are Python lists of symbolic tensors, and later
calls with arguments of the same template (cohort size, dtypes, shapes) are one
TensorFlow call. Independent work (e.g. one client's weighting next to the next
client's training) may then overlap. A computation that cannot be traced (a
graph TensorFlow cannot call from a function, a dataset in the result) is
interpreted call by call.
"""

from __future__ import annotations

from typing import Callable, Optional

from absl import logging
import tensorflow as tf
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.compiler import building_blocks as bb

from tff_algos.runtime.inprocess import tf_calls
from tff_algos.runtime.inprocess.values import Federated, struct_like


class DatasetVariant:
  """A dataset inside a traced computation: `flatten` needs only its variant."""
  __slots__ = ('_variant_tensor',)

  def __init__(self, variant):
    self._variant_tensor = variant


_TENSOR, _DATASET = object(), object()  # leaves of a template


def _all_packed(templates: list) -> Optional[list]:
  return None if any(t is None for t in templates) else templates


def pack(value, leaves: list, key: list, in_result: bool = False):
  """`value` as a template: its tensors (datasets' variants) moved to `leaves`.

  `key` receives what identifies the template (placements, cardinalities,
  names, dtypes, shapes). None where `value` holds something else than
  tensors and datasets, or, `in_result` (a result being traced), a dataset,
  which cannot leave the graph.
  """
  if isinstance(value, Federated):
    key.append((value.placement.uri, value.all_equal,
                None if value.all_equal else len(value.value)))
    if value.all_equal:
      inner = pack(value.value, leaves, key, in_result)
    else:
      inner = _all_packed([pack(v, leaves, key, in_result) for v in value.value])
    return None if inner is None else Federated(value.placement, inner, value.all_equal)
  if isinstance(value, structure.Struct):
    key.append(tuple(structure.name_list_with_nones(value)))
    inner = _all_packed([pack(v, leaves, key, in_result) for v in value])
    return None if inner is None else struct_like(value, inner)
  if isinstance(value, tf.Tensor):
    leaves.append(value)
    key.append((value.dtype, tuple(value.shape)))
    return _TENSOR
  if isinstance(value, tf.data.Dataset) and not in_result:
    leaves.append(value._variant_tensor)  # pylint: disable=protected-access
    key.append('dataset')
    return _DATASET
  return None


def unpack(template, leaves):
  """`pack`'s inverse, from an iterator over the leaves."""
  if template is _TENSOR:
    return next(leaves)
  if template is _DATASET:
    return DatasetVariant(next(leaves))
  if isinstance(template, Federated):
    inner = (unpack(template.value, leaves) if template.all_equal
             else [unpack(v, leaves) for v in template.value])
    return Federated(template.placement, inner, template.all_equal)
  return struct_like(template, [unpack(v, leaves) for v in template])


def _untraceable_tensorflow(interpreter, block: bb.ComputationBuildingBlock) -> bool:
  """Whether `block` holds a TensorFlow computation that cannot be called from
  a traced function (imports them all)."""
  todo = [block]
  while todo:
    comp = todo.pop()
    if isinstance(comp, bb.CompiledComputation):
      if (comp.proto.WhichOneof('computation') == 'tensorflow'
          and not interpreter.tensorflow(comp).traceable):
        return True
    else:
      todo.extend(comp.children())
  return False


class WholeCallTracer:
  """Whole computations, each traced once per argument template into one function."""

  MAX_TRACES_PER_COMPUTATION = 16  # cohort sizes, shapes; beyond, interpreted

  def __init__(self, host_datasets: bool = False):
    self._host_datasets = host_datasets  # then calls taking datasets are interpreted
    # (id(block), #clients, template key) -> (block, (function, result template) or None)
    self._functions: dict = {}
    self._trace_counts: dict = {}  # id(block) -> (block, number of templates traced)

  def call(self, interpreter, block: bb.Lambda, arg, interpret: Callable):
    """`interpret(arg)` (the block, interpreted), as one traced call when it can."""
    leaves, key = [], []
    template = pack(arg, leaves, key) if arg is not None else None
    if (arg is not None and template is None) or (self._host_datasets and 'dataset' in key):
      return interpret(arg)  # datasets stay on the host with `host_datasets`
    cache_key = (id(block), interpreter.num_clients, tuple(key))
    entry = self._functions.get(cache_key)
    if entry is None or entry[0] is not block:
      entry = (block, self.trace(interpreter, block, template, leaves, interpret))
      self._functions[cache_key] = entry
    if entry[1] is None:
      return interpret(arg)
    concrete, result_template = entry[1]
    outputs = tf_calls.call_without_grappler(concrete, leaves)
    return unpack(result_template, iter(outputs))

  def _give_up(self, block, reason: str):
    logging.warning('In-process backend: a computation of type %s is interpreted '
                    'call by call, not traced as a whole (%s).',
                    block.type_signature, reason.splitlines()[0][:200])
    self._trace_counts[id(block)] = (block, self.MAX_TRACES_PER_COMPUTATION)  # not again

  def trace(self, interpreter, block, template, leaves, interpret):
    """(function, result template) of the block interpreted on arguments of
    `template`; None where it is not traced."""
    count = self._trace_counts.get(id(block))
    n = count[1] if count is not None and count[0] is block else 0
    if n >= self.MAX_TRACES_PER_COMPUTATION:
      return None
    self._trace_counts[id(block)] = (block, n + 1)
    if _untraceable_tensorflow(interpreter, block):
      self._give_up(block, 'a TensorFlow computation cannot be traced into a function '
                    '(or takes datasets, which run call by call with a GPU)')
      return None
    result_templates = []

    def body(*flat):
      result = interpret(None if template is None else unpack(template, iter(flat)))
      outputs = []
      result_templates.append(pack(result, outputs, [], in_result=True))
      return outputs if result_templates[-1] is not None else []

    signature = [tf.TensorSpec(t.shape, t.dtype) for t in leaves]
    try:
      concrete = tf_calls.trace_unordered(body, signature)
    except tf.errors.InternalError as e:
      self._give_up(block, str(e))
      return None
    if result_templates[0] is None:
      self._give_up(block, 'its result holds a dataset or a value of another type')
      return None
    return concrete, result_templates[0]
