"""Splitting a centralised labelled dataset across clients (seedable, numpy).

* `iid_split`: a random permutation cut into N near-equal shards;
* `dirichlet_label_split`: label skew of Hsu et al. 2019 / paper 003 A.2: for
  every class c, proportions p_c ~ Dir(alpha * 1_N) decide which share of the
  class each client gets (small alpha: few classes per client).

Both return a list of index arrays, one per client, covering every example
exactly once.
"""

from __future__ import annotations

import collections

import numpy as np
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


def to_client_data(features: dict[str, np.ndarray], parts: list[np.ndarray],
                   prefix: str = 'client') -> tff.simulation.datasets.ClientData:
  """In-memory `ClientData` whose client k holds rows `parts[k]` of `features`."""
  width = len(str(len(parts) - 1))
  return tff.simulation.datasets.TestClientData(collections.OrderedDict(
      (f'{prefix}_{k:0{width}d}',
       collections.OrderedDict((name, v[rows]) for name, v in features.items()))
      for k, rows in enumerate(parts)))
