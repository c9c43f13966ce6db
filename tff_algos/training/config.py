"""What a training run is asked to do (`RunConfig`), checked without TensorFlow,
so that a bad --total_rounds or --shuffle is answered before TensorFlow loads."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class RunConfig:
  total_rounds: int
  clients_per_round: int
  seed: int = 0
  rounds_per_eval: int = 10          # 0: evaluate only at the end
  rounds_per_checkpoint: int = 10
  output_dir: Optional[str] = None   # None: keep nothing on disk
  progress: bool = True
  # How a client's examples are ordered each round: 'rr' a fresh permutation
  # every round (random reshuffling), 'so' one permutation per client for the
  # whole run (shuffle-once), 'none' the dataset's own order.
  shuffle: str = 'rr'
  # Periodic evaluations use the first N test examples (fixed across rounds;
  # the final evaluation always uses the whole test set). None: all.
  max_eval_examples: Optional[int] = None
  # Discard the outputs already in `output_dir` and start over at round 0.
  restart: bool = False
  # Stop (with a UserError) after this many consecutive rounds in which every
  # client diverged and was dropped (the model cannot move). 0: never stop.
  max_rounds_all_dropped: int = 10
  # None: `clients_per_round` clients drawn uniformly each round. A float p:
  # each client joins independently with probability p, the whole draw
  # repeated while nobody joins (the participation of paper 003's code).
  participation_prob: Optional[float] = None
  # Up to this many rounds in one TFF call (`core.chain`) between the rounds at
  # which something leaves the computation (evaluations, checkpoints); the
  # models and metrics are those of one round per call, bit for bit. Pays off
  # on small models over many rounds (a round's fixed cost goes once per call);
  # each chain length is traced once (~0.15 s a round on the quadratic toy).
  # Algorithms whose clients keep states, runs with a round callback, Bernoulli
  # participation (`participation_prob`: cohorts of several sizes) and several
  # workers (`--workers`) run one round per call.
  rounds_per_call: int = 1

  def __post_init__(self):
    if self.total_rounds < 1:
      raise ValueError(f'total_rounds must be >= 1, got {self.total_rounds}')
    if self.seed < 0:
      raise ValueError(f'seed must be >= 0, got {self.seed}')
    if self.clients_per_round < 1:
      raise ValueError(f'clients_per_round must be >= 1, got {self.clients_per_round}')
    if self.rounds_per_eval < 0 or self.rounds_per_checkpoint < 1:
      raise ValueError('rounds_per_eval must be >= 0 and rounds_per_checkpoint >= 1')
    if self.max_eval_examples is not None and self.max_eval_examples < 1:
      raise ValueError('max_eval_examples must be >= 1')
    if self.participation_prob is not None and not 0 < self.participation_prob <= 1:
      raise ValueError(f'participation_prob must be in (0, 1], got {self.participation_prob}')
    if self.rounds_per_call < 1:
      raise ValueError(f'rounds_per_call must be >= 1, got {self.rounds_per_call}')
    if self.shuffle not in ('rr', 'so', 'none'):
      raise ValueError(f"shuffle must be 'rr', 'so' or 'none', got {self.shuffle!r}")
    if self.max_rounds_all_dropped < 0:
      raise ValueError(f'max_rounds_all_dropped must be >= 0 (0: never stop), got '
                       f'{self.max_rounds_all_dropped}')
