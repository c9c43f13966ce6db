"""Multiclass logistic regression stacked over lanes (`tff_algos.core.lanes`).

C independent models W_c in R^{d x k}, b_c in R^k, kept as kernel [C, d, k] and
bias [C, 1, k]; every lane sees the same batch, and the loss is the sum over
lanes of each lane's mean cross-entropy, so lane c's gradient is exactly the
gradient of a single logistic model (the `synthetic_logistic` task's Dense
layer) at W_c, b_c. Given hyperparameters as `Lanes`, one training run then
trains C configurations at the cost of about one.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base


class StackedLogisticModel(base.MeanLossMetric, tff.learning.models.VariableModel):
  """C lanes of x -> x W_c + b_c with softmax cross-entropy; metric: mean loss
  over lanes."""

  def __init__(self, num_lanes: int, dim: int, num_classes: int):
    self._lanes, self._dim = num_lanes, dim
    self._kernel = tf.Variable(tf.zeros([num_lanes, dim, num_classes]), name='kernel')
    self._bias = tf.Variable(tf.zeros([num_lanes, 1, num_classes]), name='bias')
    self._init_loss_metric()

  trainable_variables = property(lambda self: [self._kernel, self._bias])
  non_trainable_variables = property(lambda self: [])

  @property
  def input_spec(self):
    return collections.OrderedDict(x=tf.TensorSpec([None, self._dim], tf.float32),
                                   y=tf.TensorSpec([None], tf.int32))

  @tf.function
  def predict_on_batch(self, x, training=True):
    del training
    return tf.einsum('bd,cdk->cbk', x, self._kernel) + self._bias    # [C, B, k]

  @tf.function
  def forward_pass(self, batch_input, training=True):
    logits = self.predict_on_batch(batch_input['x'])
    labels = tf.broadcast_to(batch_input['y'][None, :], tf.shape(logits)[:2])
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    loss = tf.reduce_sum(tf.reduce_mean(per_example, axis=1))         # sum of lane means
    n = tf.shape(batch_input['y'])[0]
    self._record_loss(tf.reduce_sum(per_example) / self._lanes, n)
    return tff.learning.models.BatchOutput(loss=loss, predictions=logits,
                                           num_examples=n)


def stacked(task: base.Task, num_lanes: int, dim: int, num_classes: int) -> base.Task:
  """`task` (a logistic task with {'x', 'y'} batches) with its model replaced by
  `num_lanes` stacked lanes; data, batching and shuffling are unchanged. No test
  set: lanes are evaluated by the caller (`cross_entropy`)."""
  return dataclasses.replace(
      task, model_fn=lambda: StackedLogisticModel(num_lanes, dim, num_classes),
      test_data=None, info=dict(task.info, model=f'logreg x {num_lanes} lanes'))


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
