"""Splitting a centralised labelled dataset across clients (seedable, numpy).

* `iid_split`: a random permutation cut into N near-equal shards;
* `dirichlet_label_split`: label skew of Hsu et al. 2019: for
  every class c, proportions p_c ~ Dir(alpha * 1_N) decide which share of the
  class each client gets (small alpha: few classes per client);
* `dirichlet_prior_split` / `iid_sized_split` with `lognormal_client_sizes`:
  paper 003 A.2's construction (per-CLIENT class priors Dir(alpha * 1_C),
  client sizes balanced or lognormal-unbalanced), as in its reference code;
* `sorted_label_split`: label-sorted contiguous shards (pathological skew).

All return a list of index arrays, one per client, covering every example
exactly once (paper 003's balanced sizes leave the n mod N remainder out).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import catalog


def iid_split(num_examples: int, num_clients: int, seed: int) -> list[np.ndarray]:
  if num_clients > num_examples:
    raise base.TaskError(f'{num_clients} clients for only {num_examples} examples; lower '
                         '--num_clients')
  order = np.random.default_rng(seed).permutation(num_examples)
  return [np.sort(part) for part in np.array_split(order, num_clients)]


def _check_alpha(alpha: float) -> None:
  """ValueError unless a Dirichlet concentration: finite and > 0 (a NaN passed
  `alpha <= 0` and made NaN proportions; the binaries check --dirichlet_alpha
  before loading anything, this guards library callers)."""
  if not (np.isfinite(alpha) and alpha > 0):
    raise ValueError(f'dirichlet alpha must be > 0 and finite, got {alpha}')


def dirichlet_label_split(labels: np.ndarray, num_clients: int, alpha: float,
                          seed: int, min_size: int = 1,
                          max_tries: int = 1000) -> list[np.ndarray]:
  _check_alpha(alpha)
  labels = np.asarray(labels)
  if num_clients * min_size > len(labels):
    raise base.TaskError(f'{num_clients} clients x {min_size} examples exceeds '
                         f'{len(labels)} examples; lower --num_clients')
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
  raise base.TaskError(f'no Dirichlet({alpha}) split gave every one of {num_clients} '
                       f'clients >= {min_size} examples in {max_tries} draws; lower '
                       '--num_clients or raise --dirichlet_alpha')


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
    self._slice_shapes = [spec.shape for spec in tf.nest.flatten(self._element_spec)]

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
    """`from_tensor_slices` of the client's rows, built from its op directly.

    The same dataset (op, elements, element spec) as
    `tf.data.Dataset.from_tensor_slices(self.client_arrays(client_id))`, at
    ~21 us instead of ~72 us a client (measured: the Python of
    `from_tensor_slices` is the rest). It counts where rounds sample new clients
    of a large population, as the quadratic toy's 10,000: 10 datasets a round.
    """
    components = [tf.constant(v) for v in tf.nest.flatten(self.client_arrays(client_id))]
    variant = tf.raw_ops.TensorSliceDataset(
        components=components, output_shapes=self._slice_shapes)
    return tf.data.experimental.from_variant(variant, self._element_spec)

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


def from_client_arrays(xs: list[np.ndarray], ys: list[np.ndarray]) -> ArrayClientData:
  """In-memory `ClientData` whose client k holds examples (xs[k], ys[k])."""
  offsets = np.cumsum([0] + [len(y) for y in ys])
  parts = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(ys))]
  return to_client_data(dict(x=np.concatenate(xs), y=np.concatenate(ys)), parts)


@dataclasses.dataclass(frozen=True)
class ClientArrays:
  """Examples held per client, and a centralised test set."""
  x: list            # per client [n_i, ...]
  y: list            # per client [n_i] int32
  x_test: np.ndarray
  y_test: np.ndarray


def array_task(name: str, features: tuple[str, str], train: tuple, test: tuple,
               parts: list[np.ndarray], batch_size: int, eval_batch_size: int,
               batches: Callable[[tf.data.Dataset, int], tf.data.Dataset],
               model_fn, info: dict, augment_fn=None) -> base.Task:
  """A task over in-memory arrays: client k holds rows `parts[k]` of `train`
  (inputs, labels), stored under the names `features`; `test` (the same) is
  the centralised test set. `batches(dataset, batch_size)` batches and
  preprocesses both."""
  train_data = to_client_data(collections.OrderedDict(zip(features, train)), parts)
  test_data = batches(tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(zip(features, test))), eval_batch_size)
  return base.Task(name=name, train_data=train_data,
                   preprocess_fn=lambda ds: batches(ds, batch_size), test_data=test_data,
                   model_fn=model_fn, info=info, augment_fn=augment_fn)


def sorted_label_split(labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
  """Label-sorted contiguous shards (the 'sorted' heterogeneous split):
  examples ordered by label (stably) and cut into N near-equal shards."""
  labels = np.asarray(labels)
  if num_clients > len(labels):
    raise base.TaskError(f'{num_clients} clients for only {len(labels)} examples; lower '
                         '--num_clients')
  order = np.argsort(labels, kind='stable')
  return [np.sort(part) for part in np.array_split(order, num_clients)]


SCHEMES = catalog.SPLITS


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


# --------------------------------------------- paper 003 (FedDyn) A.2 splits


def lognormal_client_sizes(num_examples: int, num_clients: int, sigma: float,
                           seed: int) -> np.ndarray:
  """Client dataset sizes of paper 003 (its reference code's rule).

  sigma = 0 (balanced): every client gets floor(n / N) examples (the n mod N
  left over are not used). sigma > 0 (unbalanced): s_k ~ LogNormal(log(n / N),
  sigma), rescaled to sum to n and floored; the rounding remainder goes to the
  first client, so the sizes sum to exactly n.
  """
  if sigma < 0:
    raise ValueError(f'unbalanced sigma must be >= 0, got {sigma}')
  if num_clients < 1 or num_clients > num_examples:
    raise ValueError(f'{num_clients} clients for {num_examples} examples; lower --num_clients')
  per_client = num_examples // num_clients
  if sigma == 0:
    return np.full(num_clients, per_client, np.int64)
  rng = np.random.default_rng([seed, 3])
  raw = rng.lognormal(mean=np.log(per_client), sigma=sigma, size=num_clients)
  sizes = (raw / raw.sum() * num_examples).astype(np.int64)
  sizes[0] += num_examples - sizes.sum()
  if sizes.min() < 1:
    raise ValueError(f'lognormal sigma={sigma} gave a client no examples; '
                     'use fewer clients or a smaller sigma')
  return sizes


def iid_sized_split(num_examples: int, sizes: np.ndarray, seed: int
                    ) -> list[np.ndarray]:
  """Paper 003's IID split: a random permutation cut into shards of `sizes`."""
  sizes = np.asarray(sizes, np.int64)
  if sizes.sum() > num_examples:
    raise ValueError(f'sizes sum to {sizes.sum()} > {num_examples} examples; lower --num_clients')
  order = np.random.default_rng([seed, 4]).permutation(num_examples)
  cuts = np.cumsum(sizes)[:-1]
  return [np.sort(p) for p in np.split(order[:sizes.sum()], cuts)]


def dirichlet_prior_split(labels: np.ndarray, sizes: np.ndarray, alpha: float,
                          seed: int) -> list[np.ndarray]:
  """Paper 003 A.2 (Yurochkin et al. 2019) label skew with client sizes `sizes`.

  Every client k draws class priors q_k ~ Dir(alpha * 1_C). Then, until every
  client is full, a non-full client is picked uniformly, a label is drawn from
  q_k and an example of that label is assigned without replacement. The
  reference code redraws the label while its class is exhausted; drawing from
  q_k restricted to the remaining classes is the same distribution and cannot
  loop forever.
  """
  _check_alpha(alpha)
  labels = np.asarray(labels)
  sizes = np.asarray(sizes, np.int64)
  if sizes.sum() > len(labels):
    raise ValueError(f'sizes sum to {sizes.sum()} > {len(labels)} examples; lower --num_clients')
  rng = np.random.default_rng([seed, 5])
  classes = np.unique(labels)
  pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
  left = np.array([len(p) for p in pools], np.int64)
  priors = rng.dirichlet(np.full(len(classes), alpha), size=len(sizes))
  need = sizes.copy()
  open_clients = list(np.flatnonzero(need > 0))
  shards = [[] for _ in sizes]
  uniforms = rng.random(int(sizes.sum()) * 2 + 1)
  u = 0
  while open_clients:
    slot = int(uniforms[u] * len(open_clients)); u += 1
    k = open_clients[slot]
    q = priors[k] * (left > 0)
    total = q.sum()
    q = q / total if total > 0 else (left > 0) / (left > 0).sum()
    c = min(int(np.searchsorted(np.cumsum(q), uniforms[u] * q.sum(), side='right')),
            len(classes) - 1)
    u += 1
    while left[c] == 0:  # float round-off at a boundary: nearest class left
      c = (c + 1) % len(classes)
    left[c] -= 1
    shards[k].append(pools[c].pop())
    need[k] -= 1
    if need[k] == 0:
      open_clients[slot] = open_clients[-1]
      open_clients.pop()
  return [np.sort(np.asarray(s, np.int64)) for s in shards]


FEDDYN_SCHEMES = catalog.FEDDYN_SPLITS


def feddyn_split(labels: np.ndarray, num_clients: int, scheme: str, seed: int,
                 alpha: float = 0.3, sigma: float = 0.0) -> list[np.ndarray]:
  """Paper 003's 'iid' or 'dirichlet' split with balanced (sigma = 0) or
  lognormal-unbalanced client sizes."""
  if scheme not in FEDDYN_SCHEMES:
    raise ValueError(f'unknown partition {scheme!r} for a paper-003 split; '
                     f'choose one of {", ".join(FEDDYN_SCHEMES)}')
  sizes = lognormal_client_sizes(len(labels), num_clients, sigma, seed)
  if scheme == 'iid':
    return iid_sized_split(len(labels), sizes, seed)
  return dirichlet_prior_split(labels, sizes, alpha, seed)
