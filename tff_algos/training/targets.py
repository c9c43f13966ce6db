"""Paper 003's metric: models transmitted to reach a target accuracy or loss.

Acar et al. (2021) compare "the number of models transmitted relative to one
round of FedAvg" until the test accuracy first reaches a target: FedDyn,
FedAvg and FedProx send one model to each sampled client per round, SCAFFOLD
two (the model and the server control variate), so SCAFFOLD's count is twice
its rounds. Here the count is not a hand table: round t contributes

    download_bytes_t / (cohort_size_t * model_bytes)

from the run's metrics.csv (cohort_size_t: the round's column, or the run's
clients_per_round for rows written before that column existed) (written by `tff_algos.training.loop` from the TFF type
signature of the client computation) and summary.json. Scalars an algorithm
broadcasts besides the model (round number, learning rate) are counted too,
so FedAvg's per-round count is 1.0001 rather than 1 for a small MLP.

Table 6 (the synthetic convex problem) uses the same unit with a target
TRAINING loss over all devices' data: `models_to_loss_target` takes the loss
after each round and the models one client receives per round.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional, Sequence

from tff_algos.training import summary_file
from tff_algos.training.run_dir import read_metrics

ACCURACY = 'eval/sparse_categorical_accuracy'


@dataclasses.dataclass(frozen=True)
class TargetResult:
  metric: str
  target: float
  reached: bool
  round: Optional[int]        # first round whose metric meets the target
  models_transmitted: float   # paper unit (per client, summed over rounds) up to
                              # `round`, or over every round run if not reached
  total_models: float         # all clients: sum of download bytes / model bytes
  rounds_run: int
  final_value: float          # the metric at the last evaluation (nan if none)

  def cell(self, fmt: str = '.0f') -> str:
    """'123' when reached, '200+' (a lower bound) when not: the paper's notation."""
    return format(self.models_transmitted, fmt) + ('' if self.reached else '+')


def _higher_is_better(metric: str) -> bool:
  return not metric.rstrip('/').split('/')[-1].endswith('loss')


def models_per_round(rows: Sequence[dict], model_bytes: float,
                     clients_per_round: int) -> list[float]:
  """Models sent to ONE client in each round (1 for FedAvg, 2 for SCAFFOLD),
  over the round's own cohort (`participation_prob` draws cohorts of several
  sizes; `clients_per_round` stands in where a row has no cohort_size)."""
  if model_bytes <= 0 or clients_per_round < 1:
    raise ValueError('model_bytes must be > 0 and clients_per_round >= 1')
  out = []
  for row in rows:
    if 'download_bytes' not in row:
      raise ValueError(f'round {row.get("round")} has no download_bytes column')
    cohort = row.get('cohort_size', clients_per_round)
    out.append(row['download_bytes'] / (cohort * model_bytes))
  return out


def models_to_target(rows: Sequence[dict], target: float, model_bytes: float,
                     clients_per_round: int, metric: str = ACCURACY,
                     higher_is_better: Optional[bool] = None) -> TargetResult:
  """First round where `metric` >= target (<= for losses) and the models sent
  up to and including it. Rows are metrics.csv rows (any order)."""
  if higher_is_better is None:
    higher_is_better = _higher_is_better(metric)
  rows = sorted(rows, key=lambda r: r['round'])
  per_round = models_per_round(rows, model_bytes, clients_per_round)
  sent = total = 0.0
  first = None
  final = math.nan
  for row, models in zip(rows, per_round):
    if first is None:
      sent += models
      total += row['download_bytes'] / model_bytes
    value = row.get(metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
      continue
    final = float(value)
    met = value >= target if higher_is_better else value <= target
    if met and first is None:
      first = int(row['round'])
  return TargetResult(metric=metric, target=target, reached=first is not None,
                      round=first, models_transmitted=sent, total_models=total,
                      rounds_run=int(rows[-1]['round']) if rows else 0,
                      final_value=final)


def run_models_to_target(run_dir: str, target: float, metric: str = ACCURACY,
                         higher_is_better: Optional[bool] = None) -> TargetResult:
  """`models_to_target` of a run directory (metrics.csv + summary.json)."""
  summary = summary_file.read(os.path.join(run_dir, 'summary.json'))
  rows = read_metrics(os.path.join(run_dir, 'metrics.csv'))
  return models_to_target(rows, target, summary['model_bytes'],
                          summary['clients_per_round'], metric, higher_is_better)


def models_to_loss_target(losses: Sequence[float], target: float,
                          models_per_round: float) -> Optional[float]:
  """Models sent to one client until the loss after a round first is <= target.

  `losses[t]` is the training loss after round t + 1 (over all devices' data);
  `models_per_round` the models a participating client receives per round
  (1 for FedAvg, FedProx and FedDyn, 2 for SCAFFOLD: paper 003's unit, "models
  transmitted relative to one round of FedAvg"). None if never reached; a
  non-finite loss never reaches the target.
  """
  if models_per_round <= 0:
    raise ValueError(f'models_per_round must be > 0, got {models_per_round}')
  for t, loss in enumerate(losses):
    if math.isfinite(loss) and loss <= target:
      return (t + 1) * models_per_round
  return None
