"""Helpers of the tasks: the `Task` protocol (`tff_algos.training.task`, which
the round loop trains on) and Keras / hand-written `VariableModel` wrappers."""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tasks.options import TaskError  # pylint: disable=unused-import
from tff_algos.training.task import PreprocessFn, Task  # pylint: disable=unused-import


def keras_model_fn(keras_fn: Callable[[], tf.keras.Model],
                   element_spec: Any,
                   loss_fn: Callable[[], tf.keras.losses.Loss],
                   metrics_fn: Callable[[], list[tf.keras.metrics.Metric]]):
  """Wraps a keras builder as a `model_fn` for TFF (`from_keras_model`)."""

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        keras_fn(), loss=loss_fn(), input_spec=element_spec,
        metrics=metrics_fn())

  return model_fn


def logits_classifier_fn(keras_fn: Callable[[], tf.keras.Model], element_spec: Any,
                         metrics_fn: Optional[Callable[[], list]] = None):
  """`keras_model_fn` for a model emitting class logits: sparse cross-entropy
  (from logits) and, unless `metrics_fn` says otherwise, accuracy."""
  return keras_model_fn(
      keras_fn, element_spec,
      lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn or (lambda: [tf.keras.metrics.SparseCategoricalAccuracy()]))


class PlainModel(tff.learning.models.VariableModel):
  """The accessors of a hand-written `VariableModel` with no non-trainable
  variables: a subclass sets `_weights` (its trainable variables, in order),
  `_input_spec` and, unless `MeanLossMetric` (listed first) supplies them,
  `_metric_variables`."""

  @property
  def trainable_variables(self):
    return list(self._weights)

  @property
  def non_trainable_variables(self):
    return []

  @property
  def local_variables(self):
    return list(self._metric_variables)

  @property
  def input_spec(self):
    return self._input_spec


class MeanLossMetric:
  """Mixin for hand-written `VariableModel`s whose only metric is mean loss.

  Call `_init_loss_metric()` in `__init__` and `_record_loss(total, n)` in
  `forward_pass`; provides the metric half of the VariableModel interface.
  """

  def _init_loss_metric(self):
    self._loss_sum = tf.Variable(0.0, trainable=False, name='loss_sum')
    self._count = tf.Variable(0.0, trainable=False, name='count')

  def _record_loss(self, total, n):
    self._loss_sum.assign_add(tf.cast(total, tf.float32))
    self._count.assign_add(tf.cast(n, tf.float32))

  @property
  def local_variables(self):
    return [self._loss_sum, self._count]

  @tf.function(autograph=False)
  def report_local_unfinalized_metrics(self):
    return collections.OrderedDict(loss=[self._loss_sum, self._count])

  def metric_finalizers(self):
    return collections.OrderedDict(
        loss=tf.function(lambda v: tf.math.divide_no_nan(v[0], v[1]), autograph=False))

  @tf.function(autograph=False)
  def reset_metrics(self):
    self._loss_sum.assign(0.0)
    self._count.assign(0.0)
