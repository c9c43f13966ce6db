"""Mimelite's and MimeXlite's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.algorithms.gbo.config import StatisticsOptimizer
from tff_algos.core.hparams import redefault, refuse

FULL_BATCH = 'full_batch'   # Mimelite
ONE_BATCH = 'one_batch'     # MimeXlite


@dataclasses.dataclass(frozen=True, kw_only=True)
class MimeConfig(StatisticsOptimizer, groups.LocalSchedule, groups.ServerOptimizer):
  """Mime(X)lite's round: FedGBO's local steps with the global statistics
  fixed, the statistics tracked with the clients' gradients at x_t (the full
  batch: Mimelite; one minibatch: MimeXlite), the models' mean applied by the
  server optimiser. K = 10 and SGDm (beta 0.9) by default, as paper 004."""
  local_steps: Optional[int] = redefault(10)
  gradient: str = FULL_BATCH            # or ONE_BATCH (MimeXlite)
  WHY_NOT = groups.why_not({('server_lr_decay',): '{algorithm} has no server decay'})

  def check(self):
    if self.gradient not in (FULL_BATCH, ONE_BATCH):
      raise refuse(f'gradient must be {FULL_BATCH} or {ONE_BATCH}, got {{value!r}}',
                   value=self.gradient)

  def shared_build_key(self) -> 'MimeConfig':
    """This config with eta, d_eta, K_0, d_K (the schedule's state) and the
    server optimiser's learning rate (TFF's finalizer state) fixed: configs with
    equal keys share one build (`registry.BuildCache`)."""
    return dataclasses.replace(self.shared_schedule_key(), server_learning_rate=1.0)

  def shared_server_learning_rate(self) -> float:
    return self.server_learning_rate


ALGORITHMS = (
    Algorithm('mimelite', MimeConfig, 'build_mime',
              'Mimelite: fixed global statistics tracked with full-batch client gradients at '
              'x_t (uploads x and grad f)', {'gradient': FULL_BATCH}),
    Algorithm('mimexlite', MimeConfig, 'build_mime',
              'MimeXlite (paper 004): Mimelite with one minibatch gradient at x_t',
              {'gradient': ONE_BATCH}),
)
