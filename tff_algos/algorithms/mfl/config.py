"""MFL's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.algorithms.gbo.config import (SERVER_AVERAGES, STATISTICS_OPTIMIZERS,
                                             StatisticsOptimizer)
from tff_algos.core.hparams import redefault, refuse


@dataclasses.dataclass(frozen=True, kw_only=True)
class MFLConfig(StatisticsOptimizer, groups.LocalSchedule):
  """MFL's round: clients run the optimiser with moving statistics from the
  global state; models and statistics are averaged (see `process`). K = 10 and
  SGDm (beta 0.9) by default, as paper 004. `tff_optimizer`: a
  `tff.learning.optimizers` optimiser (`core.optimizers.OptimizerSpec`: sgdm,
  rmsprop, adam), unchanged, at its own learning rate, instead."""
  local_steps: Optional[int] = redefault(10)
  tff_optimizer: Any = None   # an OptimizerSpec (Python API only)
  WHY_NOT = SERVER_AVERAGES
  NEEDS_STATISTICS = ('MFL averages client optimiser state: {client_optimizer} must be one '
                      'of %s, got {value!r}' % (STATISTICS_OPTIMIZERS,))

  def check(self):
    spec = self.tff_optimizer
    if spec is not None:
      if spec.name not in STATISTICS_OPTIMIZERS:
        raise refuse(self.NEEDS_STATISTICS, value=spec.name)
      if spec.name == 'sgdm' and not spec.get('momentum'):
        raise refuse('MFL with sgdm needs a momentum > 0 (else there is no state)')
    elif self.optimizer is None and self.client_optimizer == 'sgdm' and (
        self.client_momentum == 0):
      raise refuse('MFL with sgdm needs a momentum > 0 (else there is no state): '
                   '{client_momentum}=0')

  def client_schedule(self, server_lr=None):
    """At the learning rate of `tff_optimizer` where one is given."""
    from tff_algos.core import client_work  # pylint: disable=g-import-not-at-top
    learning_rate = (self.client_learning_rate if self.tff_optimizer is None
                     else self.tff_optimizer.learning_rate)
    return client_work.client_schedule(
        learning_rate, self.client_lr_decay, self.local_steps, self.local_steps_decay,
        self.client_epochs_per_round, server_lr=server_lr)


ALGORITHMS = (Algorithm(
    'mfl', MFLConfig, 'build_mfl',
    'MFL: client sgdm/rmsprop/adam from the global state; models and optimiser states '
    'averaged'),)
