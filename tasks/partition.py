"""Splitting a centralised labelled dataset across clients (seedable, numpy).

* `iid_split`: a random permutation cut into N near-equal shards;
* `dirichlet_label_split`: label skew of Hsu et al. 2019 / paper 003 A.2: for
  every class c, proportions p_c ~ Dir(alpha * 1_N) decide which share of the
  class each client gets (small alpha: few classes per client);
* `sorted_label_split`: label-sorted contiguous shards (pathological skew).

All return a list of index arrays, one per client, covering every example
exactly once.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def iid_split(num_examples: int, num_clients: int, seed: int) -> list[np.ndarray]:
  if num_clients > num_examples:
    raise ValueError(f'{num_clients} clients for only {num_examples} examples')
  order = np.random.default_rng(seed).permutation(num_examples)
  return [np.sort(part) for part in np.array_split(order, num_clients)]


def dirichlet_label_split(labels: np.ndarray, num_clients: int, alpha: float,
                          seed: int, min_size: int = 1,
                          max_tries: int = 1000) -> list[np.ndarray]:
  if alpha <= 0:
    raise ValueError(f'dirichlet alpha must be > 0, got {alpha}')
  labels = np.asarray(labels)
  if num_clients * min_size > len(labels):
    raise ValueError(f'{num_clients} clients x {min_size} examples exceeds '
                     f'{len(labels)} examples')
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    shards = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
      idx = rng.permutation(np.flatnonzero(labels == c))
      p = rng.dirichlet(np.full(num_clients, alpha))
      cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
      for shard, part in zip(shards, np.split(idx, cuts)):
        shard.extend(part.tolist())
    if min(len(s) for s in shards) >= min_size:
      return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
  raise RuntimeError(f'no Dirichlet({alpha}) split gave every one of '
                     f'{num_clients} clients >= {min_size} examples')


class ArrayClientData(tff.simulation.datasets.ClientData):
  """In-memory `ClientData` over numpy arrays: client k holds rows `parts[k]`.

  Rows are stored once, grouped by client (contiguous slices), so building a
  client's dataset is one `from_tensor_slices` of views: O(client size), not
  O(dataset) like `TestClientData`, which bakes every client into a graph.
  """

  def __init__(self, features: dict[str, np.ndarray], parts: list[np.ndarray],
               prefix: str = 'client'):
    width = len(str(len(parts) - 1))
    self._ids = [f'{prefix}_{k:0{width}d}' for k in range(len(parts))]
    self._index = {cid: k for k, cid in enumerate(self._ids)}
    order = np.concatenate(parts) if parts else np.zeros([0], np.int64)
    self._features = collections.OrderedDict(
        (name, np.ascontiguousarray(v[order])) for name, v in features.items())
    self._offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    self._element_spec = collections.OrderedDict(
        (name, tf.TensorSpec(v.shape[1:], tf.as_dtype(v.dtype)))
        for name, v in self._features.items())

  @property
  def client_ids(self) -> list[str]:
    return list(self._ids)

  @property
  def element_type_structure(self):
    return self._element_spec

  def client_arrays(self, client_id: str) -> dict[str, np.ndarray]:
    if client_id not in self._index:
      raise ValueError(f'{client_id!r} is not a client of this dataset')
    k = self._index[client_id]
    lo, hi = self._offsets[k], self._offsets[k + 1]
    return collections.OrderedDict((n, v[lo:hi]) for n, v in self._features.items())

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(self.client_arrays(client_id))

  @property
  def serializable_dataset_fn(self):
    """Traceable id -> dataset (bakes the arrays into the graph when traced)."""
    ids = tf.constant(self._ids)
    offsets = tf.constant(self._offsets, tf.int64)

    def dataset_fn(client_id):
      k = tf.argmax(tf.cast(tf.equal(ids, client_id), tf.int32), output_type=tf.int64)
      lo, hi = offsets[k], offsets[k + 1]
      return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          (n, tf.constant(v)[lo:hi]) for n, v in self._features.items()))

    return dataset_fn


def to_client_data(features: dict[str, np.ndarray], parts: list[np.ndarray],
                   prefix: str = 'client') -> ArrayClientData:
  """In-memory `ClientData` whose client k holds rows `parts[k]` of `features`."""
  return ArrayClientData(features, parts, prefix)


def sorted_label_split(labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
  """Label-sorted contiguous shards (the 'sorted' heterogeneous split):
  examples ordered by label (stably) and cut into N near-equal shards."""
  labels = np.asarray(labels)
  if num_clients > len(labels):
    raise ValueError(f'{num_clients} clients for only {len(labels)} examples')
  order = np.argsort(labels, kind='stable')
  return [np.sort(part) for part in np.array_split(order, num_clients)]


SCHEMES = ('iid', 'sorted', 'dirichlet')


def split(labels: np.ndarray, num_clients: int, scheme: str, seed: int,
          alpha: float = 0.5) -> list[np.ndarray]:
  """`iid_split`, `sorted_label_split` or `dirichlet_label_split` by name."""
  if scheme == 'iid':
    return iid_split(len(labels), num_clients, seed)
  if scheme == 'sorted':
    return sorted_label_split(labels, num_clients)
  if scheme == 'dirichlet':
    return dirichlet_label_split(labels, num_clients, alpha, seed)
  raise ValueError(f'unknown partition {scheme!r}; choose one of {", ".join(SCHEMES)}')
