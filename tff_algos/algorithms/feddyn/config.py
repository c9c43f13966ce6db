"""FedDyn's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import above, hparam


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedDynConfig(groups.LocalSchedule, groups.LocalRegularization, groups.DeviceAverage):
  """FedDyn's round: plain local SGD on the dynamically regularised objective,
  with the reference code's options (see `process`)."""
  alpha: float = hparam(0.01, 'FedDyn: dynamic regulariser alpha.', flag='feddyn_alpha',
                        valid=above(0))
  adaptive_alpha: bool = hparam(False, 'FedDyn: alpha_k = alpha / (n_k / mean n) (reference '
                                       'code).', flag='feddyn_adaptive_alpha')
  weight_decay_form: bool = hparam(False, 'FedDyn: the alpha quadratic as SGD weight decay, '
                                          'outside gradient clipping (reference code).',
                                   flag='feddyn_weight_decay_form')
  WHY_NOT = {**groups.PLAIN_SGD_CLIENTS, **groups.why_not({
      ('uniform_weighting',): 'its server rule averages the active clients with equal '
                              'weights, theta = mean theta_k - h/alpha, as paper 003',
      groups.SERVER_STEP_FLAGS:
      'feddyn has its own server rule, theta = mean theta_k - h/alpha'})}

  def shared_build_key(self) -> 'FedDynConfig':
    return self.shared_schedule_key()


ALGORITHMS = (Algorithm(
    'feddyn', FedDynConfig, 'build_feddyn',
    'FedDyn (paper 003): dynamic regulariser alpha, per-client state grad L_k (disk-backed '
    'store), server h'),)
