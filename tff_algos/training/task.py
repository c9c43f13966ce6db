"""The one interface every task implements: what the round loop trains on.

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

import dataclasses
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

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
