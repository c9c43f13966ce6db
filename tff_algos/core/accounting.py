"""Communication cost from TFF value types (not hand-written tables), and
client FLOPs measured on the model's training-step graph (paper 004 App. B).

A client downloads the parameter of the per-client computation except its
dataset (model weights, broadcast hyperparameters and statistics) and uploads
its result (update, weight, metrics). Sizes come from the tensor types.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def type_bytes(type_spec: tff.Type) -> int:
  """Bytes of one value of `type_spec` (sequences count as 0: they stay local)."""
  if isinstance(type_spec, tff.TensorType):
    shape = tuple(type_spec.shape)
    if any(d is None for d in shape):
      raise ValueError(f'cannot size a tensor of unknown shape: {type_spec}')
    dtype = getattr(type_spec.dtype, 'as_numpy_dtype', type_spec.dtype)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  if isinstance(type_spec, tff.StructType):
    return sum(type_bytes(t) for t in type_spec)
  if isinstance(type_spec, tff.FederatedType):
    return type_bytes(type_spec.member)
  if isinstance(type_spec, tff.SequenceType):
    return 0
  raise TypeError(f'unsupported type {type_spec}')


@dataclasses.dataclass(frozen=True)
class ClientTraffic:
  download_bytes: int   # per participating client per round
  upload_bytes: int
  model_bytes: int      # trainable weights, the paper's unit

  @property
  def download_models(self) -> float:
    return self.download_bytes / self.model_bytes

  @property
  def upload_models(self) -> float:
    return self.upload_bytes / self.model_bytes


def client_traffic(client_computation: tff.Computation,
                   model_weights_type: tff.Type) -> ClientTraffic:
  sig = client_computation.type_signature
  params = sig.parameter
  down = sum(type_bytes(p) for p in params if not isinstance(p, tff.SequenceType))
  return ClientTraffic(download_bytes=down, upload_bytes=type_bytes(sig.result),
                       model_bytes=type_bytes(model_weights_type.trainable))


@dataclasses.dataclass(frozen=True)
class ComputeModel:
  """What an algorithm's clients compute beyond plain local SGD (paper 004 App. B).

  Client FLOPs per round = (fwd+bwd FLOPs per example) x (examples trained on)
  + optimizer_flops_per_param x |x| x (local steps) + the extra gradient passes
  named here. The model-dependent fwd+bwd count is measured, not tabulated.
  """
  optimizer_flops_per_param: float = 2.0   # plain SGD: y <- y - lr * g
  # Extra gradient evaluations per client and round, besides local training:
  # None, 'full_batch' (Mimelite: grad f_i(x_t) over the whole local dataset)
  # or 'one_batch' (MimeXlite: one minibatch gradient at x_t).
  extra_gradient: str | None = None

  def __post_init__(self):
    if self.extra_gradient not in (None, 'full_batch', 'one_batch'):
      raise ValueError(f'extra_gradient must be None, full_batch or one_batch, '
                       f'got {self.extra_gradient!r}')


# ---------------------------------------------------------------- client FLOPs
#
# Paper 004, App. B: N = K (B (fwd+bwd) + C_opt |x|) [+ n (fwd+bwd) for
# Mimelite's full-batch gradient]. The model's fwd+bwd cost per example is
# measured on the TensorFlow graph of one training step (forward pass, loss and
# gradient w.r.t. the trainable weights) with TF's per-op FLOPs statistics (the
# registry behind `tf.compat.v1.profiler`'s float_operation view: a MatMul of
# m x k by k x n is 2mkn FLOPs). The paper used thop's multiply-accumulate
# counts with the "backward = 2 x forward" rule, i.e. about half of these
# numbers for the same model.


@dataclasses.dataclass(frozen=True)
class ModelCost:
  """What the FLOPs model needs to know about a model."""
  fwd_bwd_flops_per_example: float   # nan when it could not be measured
  num_params: int                    # |x|: trainable parameters


def _count_graph_flops(graph, operations) -> tuple[float, list[str]]:
  """Sum of the registered 'flops' statistics of `operations`; also returns
  the types of control-flow ops whose bodies the count cannot see."""
  from tensorflow.python.framework import ops as tf_ops  # pylint: disable=g-direct-tensorflow-import
  total, opaque = 0.0, []
  for op in operations:
    if op.type in ('While', 'StatelessWhile', 'If', 'StatelessIf',
                   'PartitionedCall', 'StatefulPartitionedCall'):
      opaque.append(op.type)
      continue
    try:
      stats = tf_ops.get_stats_for_node_def(graph, op.node_def, 'flops')
    except ValueError:  # no FLOPs registered for this op type (e.g. Relu)
      continue
    if stats.value:
      total += stats.value
  return total, opaque


def training_step_flops(model_fn, batch_size: int) -> float:
  """FLOPs of one training step (forward, loss, gradient) on a batch.

  The step is built as one flat graph: TF functions run as plain Python (so
  `forward_pass` and Keras calls are inlined) and Keras RNN layers are
  unrolled, so every op has static shapes and loop bodies are counted once per
  time step. Only ops the gradient depends on are counted. Every input
  dimension but the batch must be static.
  """
  graph = tf.Graph()
  eager_functions = tf.config.functions_run_eagerly()
  tf.config.run_functions_eagerly(True)
  try:
    with graph.as_default():
      model = model_fn()
      keras_model = getattr(model, '_keras_model', None)  # tff.learning Keras wrapper
      if keras_model is not None:
        for layer in keras_model.submodules:
          if isinstance(layer, tf.keras.layers.RNN):
            layer.unroll = True

      def zeros(spec):
        shape = list(spec.shape)
        if not shape or any(d is None for d in shape[1:]):
          raise ValueError(f'cannot measure FLOPs: input {spec} needs a static '
                           'shape apart from the batch dimension')
        return tf.zeros([batch_size] + shape[1:], spec.dtype)

      batch = tf.nest.map_structure(zeros, model.input_spec)
      first = len(graph.get_operations())
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      grads = tape.gradient(output.loss, model.trainable_variables)
      step_ops = set(graph.get_operations()[first:])
  finally:
    tf.config.run_functions_eagerly(eager_functions)
  # Only what the gradient needs: TF builds, then prunes, e.g. the gradient
  # into the input images, and metric updates are not part of the step.
  needed, stack = set(), [g.op for g in grads if g is not None]
  while stack:
    op = stack.pop()
    if op in needed or op not in step_ops:
      continue
    needed.add(op)
    stack.extend(t.op for t in op.inputs)
  flops, opaque = _count_graph_flops(graph, needed)
  if opaque:
    raise ValueError(f'cannot measure FLOPs through {sorted(set(opaque))} ops '
                     '(a loop or function the count cannot see into)')
  return flops


_MODEL_COSTS: dict[int, tuple[Any, ModelCost]] = {}


def model_cost(model_fn, batch_size: int = 4) -> ModelCost:
  """fwd+bwd FLOPs per example (one step on `batch_size` examples divided by
  it) and |x| of `model_fn`'s model; cached per `model_fn`. A model that
  cannot be measured gets nan FLOPs and a warning, not an error: accounting
  must not stop a training run."""
  key = id(model_fn)
  if key in _MODEL_COSTS and _MODEL_COSTS[key][0] is model_fn:
    return _MODEL_COSTS[key][1]
  with tf.Graph().as_default():
    num_params = int(sum(np.prod(v.shape.as_list(), dtype=np.int64)
                         for v in model_fn().trainable_variables))
  try:
    per_example = training_step_flops(model_fn, batch_size) / batch_size
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('client FLOPs not measured: %s', e)
    per_example = float('nan')
  cost = ModelCost(fwd_bwd_flops_per_example=per_example, num_params=num_params)
  _MODEL_COSTS[key] = (model_fn, cost)
  return cost


def dataset_size(ds) -> tuple[int, int, int]:
  """(examples, batches, examples in the first batch) of one pass of a
  batched dataset, by iterating it eagerly."""
  examples = batches = first = 0
  for batch in ds:
    n = int(tf.shape(tf.nest.flatten(batch)[0])[0])
    first = first or n
    examples += n
    batches += 1
  return examples, batches, first


class ClientSizes:
  """Sizes of the clients' datasets, counted once per client and run (a pass
  over a client's data costs ~20 ms; the sizes do not change between rounds)."""

  def __init__(self):
    self._sizes: dict[str, tuple[int, int, int]] = {}
    self._mean_batch: Optional[float] = None

  def __call__(self, client_ids, datasets) -> list[tuple[int, int, int]]:
    for cid, ds in zip(client_ids, datasets):
      if cid not in self._sizes:
        self._sizes[cid] = dataset_size(ds)
    return [self._sizes[cid] for cid in client_ids]

  def mean_batch_size(self, client_ids, datasets) -> float:
    """Examples per batch of the first client seen in the run (an estimate
    for models without a num_examples metric; fixed for the run)."""
    if self._mean_batch is None:
      n, batches, _ = self(client_ids[:1], datasets[:1])[0]
      self._mean_batch = n / max(1, batches)
    return self._mean_batch


def _find(row: Mapping[str, Any], suffix: str) -> Optional[float]:
  for key, value in row.items():
    if key == suffix or key.endswith('/' + suffix):
      return value
  return None


def round_client_flops(compute: ComputeModel, cost: ModelCost,
                       row: Mapping[str, Any], sizes: Optional[ClientSizes] = None,
                       client_ids: Sequence[str] = (), datasets: Sequence[Any] = ()
                       ) -> float:
  """Client FLOPs of one round, summed over the cohort (paper 004 App. B):

      (fwd+bwd) x examples trained on  +  C_opt x |x| x local steps
      + (fwd+bwd) x examples of the extra gradient pass (Mimelite: all n_i;
        MimeXlite: one minibatch)

  `row` holds the round's flattened measurements: the model's training metric
  `.../train/num_examples` and `.../client_steps` (both cohort sums, as the
  client work reports them). `sizes` (the run's `ClientSizes`) counts the
  cohort's datasets (`client_ids`, `datasets`), only for an extra gradient
  pass or, for models without a num_examples metric, to estimate examples as
  steps x the mean batch size.
  """
  examples = _find(row, 'train/num_examples')
  steps = _find(row, 'client_steps')
  if steps is None or (examples is None and not datasets):
    return float('nan')
  sizes = sizes or ClientSizes()
  if examples is None:
    examples = float(steps) * sizes.mean_batch_size(client_ids, datasets)
  extra = 0
  if compute.extra_gradient is not None and datasets:
    index = 0 if compute.extra_gradient == 'full_batch' else 2
    extra = sum(size[index] for size in sizes(client_ids, datasets))
  return (cost.fwd_bwd_flops_per_example * (float(examples) + extra)
          + compute.optimizer_flops_per_param * cost.num_params * float(steps))


# metrics.csv column -> its running total.
CUMULATIVE_COLUMNS = (('upload_bytes', 'cum_upload_bytes'),
                      ('download_bytes', 'cum_download_bytes'),
                      ('client_flops', 'cum_client_flops'))


class CumulativeCost:
  """Running totals of the per-round cost columns, continued across resumes
  from the rows already in metrics.csv (`rows`: the rows up to the checkpoint)."""

  def __init__(self, rows: Sequence[Mapping[str, Any]] = ()):
    self.totals = {cum: 0.0 for _, cum in CUMULATIVE_COLUMNS}
    for row in rows:
      self._add(row)

  def _add(self, row):
    for col, cum in CUMULATIVE_COLUMNS:
      value = row.get(col)
      if isinstance(value, (int, float)):
        # A NaN cost (FLOPs that could not be measured) makes the total NaN:
        # an unknown cost must not read as 0 in "cost to reach" tables.
        self.totals[cum] += value

  def update(self, row: dict) -> None:
    """Adds the round's costs and writes the running totals into `row`."""
    self._add(row)
    row.update(self.totals)
