"""What a training run is asked to do (`RunConfig`), its fields declared once
with their flags (`core.hparams`) and checked without TensorFlow, so that a bad
--total_rounds or --shuffle is answered before TensorFlow loads."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.core.hparams import Config, at_least, hparam, within


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(Config):
  """The round loop's settings (`loop.run_training`)."""
  total_rounds: int = hparam(100, 'Number of rounds.', valid=at_least(1))
  clients_per_round: int = hparam(10, 'Clients sampled per round (M).', valid=at_least(1))
  seed: int = hparam(0, 'Seed of sampling, shuffling, init and data splits.',
                     valid=at_least(0))
  rounds_per_eval: int = hparam(10, 'Evaluate every this many rounds (0: only at the end).',
                                valid=at_least(0))
  rounds_per_checkpoint: int = hparam(10, 'Checkpoint every this many rounds.',
                                      valid=at_least(1))
  output_dir: Optional[str] = None   # None: keep nothing on disk
  progress: bool = hparam(True, 'Show a progress bar.')
  shuffle: str = hparam('rr', "Client example order: 'rr' reshuffled every round, 'so' "
                              "shuffled once per client for the whole run, 'none' as stored.",
                        choices=('rr', 'so', 'none'))
  max_eval_examples: Optional[int] = hparam(
      None, 'Periodic evaluations use this many test examples (a fixed sample; the final '
            'one uses all). google-research uses 10000 for StackOverflow.', valid=at_least(1))
  restart: bool = hparam(False, 'Delete the outputs already in <root_output_dir>/'
                                '<experiment_name> (checkpoints, metrics, client states) and '
                                'start the run over at round 0, instead of resuming it.')
  max_rounds_all_dropped: int = hparam(
      10, 'Stop the run after this many rounds in a row in which every client diverged '
          '(non-finite update) and was dropped; 0: never stop.', valid=at_least(0))
  # None: `clients_per_round` clients drawn uniformly each round. A float p:
  # each client joins independently with probability p, the whole draw
  # repeated while nobody joins (the participation of paper 003's code).
  participation_prob: Optional[float] = hparam(
      None, "Each client joins each round with this probability, the draw repeated while "
            "nobody joins (paper 003's code); unset: --clients_per_round clients drawn "
            'uniformly.', valid=within(0, 1, low_open=True))
  # Up to this many rounds in one TFF call (`training.chain`) between the
  # rounds at which something leaves the computation (evaluations,
  # checkpoints); the models and metrics are those of one round per call, bit
  # for bit. Pays off on small models over many rounds (a round's fixed cost
  # goes once per call); each chain length is traced once (~0.15 s a round on
  # the quadratic toy). Algorithms whose clients keep states, runs with a round
  # callback, Bernoulli participation (`participation_prob`: cohorts of
  # several sizes) and several workers (`--workers`) run one round per call.
  rounds_per_call: int = hparam(
      1, 'Run up to this many rounds in one TFF call between evaluations and checkpoints '
         '(same models and metrics, bit for bit). Faster on small models over many rounds '
         '(10 on the quadratic toy: ~6.5 -> ~4.2 ms a trainer round, but ~1.5 s more at the '
         'first call; pays after ~700 rounds). One round per call (with a note) for '
         'algorithms whose clients keep states, --participation_prob and --workers.',
      valid=at_least(1))
