"""The one interface every task implements.

A `Task` is what an algorithm and the trainer need from a dataset/model pair:

* `train_data`: a `tff.simulation.datasets.ClientData` of RAW (unbatched) client
  examples, keyed by client id;
* `preprocess_fn`: raw client dataset -> batched dataset covering ONE epoch, with
  no shuffling (the trainer shuffles the raw examples with a seed derived from
  (seed, round, client), so runs are reproducible and resumable);
* `augment_fn` (optional): the same with random data augmentation drawn from a
  seed, which the trainer derives from (seed, round, client);
* `test_data`: a centralised, already batched evaluation `tf.data.Dataset`
  (or None);
* `model_fn`: a no-arg callable building a fresh `tff.learning.models.VariableModel`
  whose `forward_pass` consumes the batches of `preprocess_fn`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tasks.options import TaskError  # pylint: disable=unused-import

PreprocessFn = Callable[[tf.data.Dataset], tf.data.Dataset]


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  train_data: tff.simulation.datasets.ClientData
  preprocess_fn: PreprocessFn
  model_fn: Callable[[], tff.learning.models.VariableModel]
  test_data: Optional[tf.data.Dataset] = None
  # Free-form facts for summaries and reports (model name, #clients, source).
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  # False where shuffling cannot change anything (e.g. one example per client).
  shuffle: bool = True
  # (raw client dataset, seed) -> batches with random augmentation (training only).
  augment_fn: Optional[Callable[[tf.data.Dataset, int], tf.data.Dataset]] = None

  @property
  def client_ids(self) -> list[str]:
    return list(self.train_data.client_ids)

  @property
  def uses_shuffle_seed(self) -> bool:
    """Whether `client_dataset`'s `shuffle_seed` can change what it gives."""
    return self.shuffle

  def client_dataset(self, client_id: str, shuffle_seed: Optional[int] = None,
                     reshuffle_each_epoch: bool = True,
                     augment_seed: Optional[int] = None) -> tf.data.Dataset:
    """Batched one-epoch dataset of a client, its raw examples shuffled by seed.

    When the round repeats the dataset (K steps > one epoch), each further pass
    is reshuffled (deterministically) unless `reshuffle_each_epoch` is False.
    With `augment_seed`, a task with an `augment_fn` draws its augmentation
    from it; without, such a task gives its evaluation preprocessing.
    """
    ds = self.train_data.create_tf_dataset_for_client(client_id)
    if shuffle_seed is not None and self.shuffle:
      ds = ds.shuffle(_SHUFFLE_BUFFER, seed=shuffle_seed,
                      reshuffle_each_iteration=reshuffle_each_epoch)
    if augment_seed is not None and self.augment_fn is not None:
      return self.augment_fn(ds, augment_seed)
    return self.preprocess_fn(ds)


# Larger than any client of the supported datasets (StackOverflow's largest
# clients hold a few thousand examples; the buffer only stores what exists).
_SHUFFLE_BUFFER = 10_000


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
