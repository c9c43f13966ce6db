"""FedGBO's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.algorithms.gbo.config import SERVER_AVERAGES, StatisticsOptimizer
from tff_algos.core.hparams import refuse, reuse


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedGBOConfig(StatisticsOptimizer, groups.ClientDecay):
  """FedGBO's round (paper 004, Algorithm 1): K local steps with the global
  statistics fixed, the server's mean and inverse step (see `process`);
  K = 10 and SGDm (beta 0.9) by default, as Sec. 5."""
  local_steps: Optional[int] = reuse(groups.LocalWork, 'local_steps', 10)     # K_0
  local_steps_decay: float = reuse(groups.LocalWork, 'local_steps_decay', 1.0)
  WHY_NOT = {**SERVER_AVERAGES, **groups.why_not({
      ('client_epochs_per_round',): 'fedgbo needs {local_steps} (K): its inverse step '
                                    'divides by K'})}

  def check(self):
    if not self.client_learning_rate > 0:
      raise refuse('FedGBO needs a learning rate eta > 0 (its inverse step divides by it), '
                   'got {client_learning_rate}={value}', value=self.client_learning_rate)
    if self.local_steps is None:
      raise refuse('fedgbo needs {local_steps} (K): its inverse step divides by K')

  def shared_build_key(self) -> 'FedGBOConfig':
    """This config with eta, d_eta, K_0, d_K (read from the schedule's state)
    fixed: configs with equal keys share one build (`registry.BuildCache`)."""
    return dataclasses.replace(self, client_learning_rate=1.0, client_lr_decay=1.0,
                               local_steps=1, local_steps_decay=1.0)

  def client_schedule(self):
    """eta_t = eta d_eta^t and K_t = ceil(K_0 d_K^t) steps, never epochs
    (TensorFlow: for the builders)."""
    from tff_algos.core import client_work, schedules  # pylint: disable=g-import-not-at-top
    return client_work.ClientSchedule(
        learning_rate=schedules.ExponentialDecay(self.client_learning_rate,
                                                 self.client_lr_decay),
        local_steps=schedules.LocalSteps(self.local_steps, self.local_steps_decay))

  def schedule_values(self):
    return self.client_schedule().state_values()


ALGORITHMS = (Algorithm(
    'fedgbo', FedGBOConfig, 'build_fedgbo',
    'FedGBO (paper 004): client sgdm/rmsprop/adam with global statistics fixed during K '
    'local steps, tracked by the inverse step'),)
