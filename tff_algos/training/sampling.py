"""Who takes part in a round and in which order their examples come.

Everything random is a pure function of (seed, round): the cohort is drawn
from `default_rng([seed, t])` and each client's example order and augmentation
from seeds derived from (seed, t, client), so a resumed run draws exactly what
an uninterrupted one would.
"""

from __future__ import annotations

from typing import Optional
import zlib

import numpy as np


def sample_clients(client_ids: list[str], clients_per_round: int, seed: int,
                   round_num: int) -> list[str]:
  """Uniformly without replacement within the round; fresh every round."""
  if clients_per_round > len(client_ids):
    raise ValueError(f'clients_per_round={clients_per_round} exceeds the '
                     f'{len(client_ids)} clients of the task')
  rng = np.random.default_rng([seed, round_num])
  return [client_ids[i] for i in rng.choice(len(client_ids), clients_per_round,
                                            replace=False)]


def sample_participants(client_ids: list[str], prob: float, seed: int,
                        round_num: int) -> list[str]:
  """Each client joins with probability `prob`; redrawn while none joins."""
  rng = np.random.default_rng([seed, round_num, 3])
  while True:
    joined = np.flatnonzero(rng.random(len(client_ids)) < prob)
    if joined.size:
      return [client_ids[i] for i in joined]


def draw_cohort(client_ids: list[str], config, round_num: int) -> list[str]:
  """The round's cohort under `config`'s (a `RunConfig`) participation scheme."""
  if config.participation_prob is None:
    return sample_clients(client_ids, config.clients_per_round, config.seed, round_num)
  return sample_participants(client_ids, config.participation_prob, config.seed,
                             round_num)


def shuffle_seed(mode: str, seed: int, round_num: int, client_id: str) -> Optional[int]:
  """Seed of a client's example order in a round (None: no shuffling).

  'rr': a function of (seed, round, client); 'so': of (seed, client) only, so
  the same permutation is used in every round, across resumes too.
  """
  if mode == 'none':
    return None
  cid = zlib.crc32(client_id.encode())
  key = [seed, cid, 2] if mode == 'so' else [seed, round_num, cid, 1]
  return int(np.random.default_rng(key).integers(2**31 - 1))


def augment_seed(seed: int, round_num: int, client_id: str) -> int:
  """Seed of a client's data augmentation in a round (whatever the shuffle mode)."""
  cid = zlib.crc32(client_id.encode())
  return int(np.random.default_rng([seed, round_num, cid, 3]).integers(2**31 - 1))
