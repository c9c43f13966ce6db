"""Multiclass logistic regression stacked over lanes (`tff_algos.core.lanes`).

C independent models W_c in R^{d x k}, b_c in R^k, kept as kernel [C, d, k] and
bias [C, 1, k]; every lane sees the same batch, and the loss is the sum over
lanes of each lane's mean cross-entropy, so lane c's gradient is exactly the
gradient of a single logistic model (the `synthetic_logistic` task's Dense
layer) at W_c, b_c. Given hyperparameters as `Lanes`, one training run then
trains C configurations at the cost of about one.

With G data groups (`data_groups`), each example carries G datasets' features
and labels side by side (x [G, d], y [G]: e.g. paper 003's synthetic settings
drawn with equal client sizes), and lane l = g * C + c trains configuration c on
dataset g: one run then trains G x C (dataset, configuration) pairs. Shuffling
and batching permute whole examples, so dataset g sees exactly the batches a
run on it alone would see.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import partition


class StackedLogisticModel(base.MeanLossMetric, tff.learning.models.VariableModel):
  """C lanes of x -> x W_c + b_c with softmax cross-entropy; metric: mean loss
  over lanes."""

  def __init__(self, num_lanes: int, dim: int, num_classes: int, data_groups: int = 1):
    if num_lanes % data_groups:
      raise ValueError(f'{num_lanes} lanes do not split into {data_groups} data groups')
    self._lanes, self._dim, self._groups = num_lanes, dim, data_groups
    self._kernel = tf.Variable(tf.zeros([num_lanes, dim, num_classes]), name='kernel')
    self._bias = tf.Variable(tf.zeros([num_lanes, 1, num_classes]), name='bias')
    self._init_loss_metric()

  trainable_variables = property(lambda self: [self._kernel, self._bias])
  non_trainable_variables = property(lambda self: [])

  @property
  def input_spec(self):
    groups = [] if self._groups == 1 else [self._groups]
    return collections.OrderedDict(
        x=tf.TensorSpec([None] + groups + [self._dim], tf.float32),
        y=tf.TensorSpec([None] + groups, tf.int32))

  @tf.function(autograph=False)
  def predict_on_batch(self, x, training=True):
    del training
    if self._groups == 1:
      return tf.einsum('bd,cdk->cbk', x, self._kernel) + self._bias  # [C, B, k]
    g, (_, d, k) = self._groups, self._kernel.shape[-3:]
    kernel = tf.reshape(self._kernel, [g, -1, d, k])                 # [G, C, d, k]
    logits = tf.einsum('bgd,gcdk->gcbk', x, kernel)
    return tf.reshape(logits, [self._lanes, -1, k]) + self._bias       # [G C, B, k]

  def _labels(self, y, logits):
    """Each lane's labels [lanes, B] (lane g * C + c: dataset g's)."""
    if self._groups == 1:
      return tf.broadcast_to(y[None, :], tf.shape(logits)[:2])
    per_group = tf.transpose(y)[:, None, :]                           # [G, 1, B]
    shape = tf.stack([self._groups, self._lanes // self._groups, tf.shape(y)[0]])
    return tf.reshape(tf.broadcast_to(per_group, shape), tf.shape(logits)[:2])

  @tf.function(autograph=False)
  def forward_pass(self, batch_input, training=True):
    logits = self.predict_on_batch(batch_input['x'])
    labels = self._labels(batch_input['y'], logits)
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    loss = tf.reduce_sum(tf.reduce_mean(per_example, axis=1))         # sum of lane means
    n = tf.shape(batch_input['y'])[0]
    self._record_loss(tf.reduce_sum(per_example) / self._lanes, n)
    return tff.learning.models.BatchOutput(loss=loss, predictions=logits,
                                           num_examples=n)


def stacked(task: base.Task, num_lanes: int, dim: int, num_classes: int,
            data_groups: int = 1) -> base.Task:
  """`task` (a logistic task with {'x', 'y'} batches) with its model replaced by
  `num_lanes` stacked lanes; data, batching and shuffling are unchanged. No test
  set: lanes are evaluated by the caller (`cross_entropy`). With `data_groups`
  G > 1 the task's examples must hold G datasets side by side
  (`group_client_data`)."""
  return dataclasses.replace(
      task, model_fn=lambda: StackedLogisticModel(num_lanes, dim, num_classes, data_groups),
      test_data=None, info=dict(task.info, model=f'logreg x {num_lanes} lanes'))


def group_client_data(xs: Sequence[Sequence[np.ndarray]],
                      ys: Sequence[Sequence[np.ndarray]]):
  """Client data whose client k's example j holds every dataset's example j of
  client k: x [G, d], y [G] (`xs[g][k]`: dataset g's client k, [n_k, d]). The
  datasets must give each client the same number of examples."""
  sizes = {tuple(len(a) for a in group) for group in list(xs) + list(ys)}
  if len(sizes) != 1:
    raise ValueError('grouped datasets need equal client sizes, got '
                     f'{len(sizes)} different size vectors')
  return partition.from_client_arrays(
      [np.stack(per_group, axis=1) for per_group in zip(*xs)],
      [np.stack(per_group, axis=1) for per_group in zip(*ys)])


def zero_weights(num_lanes: int, dim: int, num_classes: int
                 ) -> tff.learning.models.ModelWeights:
  """All lanes at W = 0, b = 0 (the reference code's initial model)."""
  return tff.learning.models.ModelWeights(
      trainable=[np.zeros([num_lanes, dim, num_classes], np.float32),
                 np.zeros([num_lanes, 1, num_classes], np.float32)],
      non_trainable=[])


def cross_entropy(kernel: np.ndarray, bias: np.ndarray, x: np.ndarray,
                  y: np.ndarray) -> np.ndarray:
  """Mean cross-entropy of each lane over (x, y), in float64: [C]."""
  logits = np.einsum('nd,cdk->cnk', x.astype(np.float64), kernel.astype(np.float64))
  logits = logits + bias.astype(np.float64)
  top = logits.max(axis=2, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(axis=2)) + top[..., 0]
  picked = np.take_along_axis(logits, y[None, :, None].astype(np.int64), axis=2)[..., 0]
  return (log_z - picked).mean(axis=1)
