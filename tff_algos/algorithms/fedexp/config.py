"""FedExP's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import above, hparam


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedExPConfig(groups.LocalSchedule):
  """FedExP's round (Algorithm 1): clients run K steps (or E epochs) of plain
  SGD at gamma; the server takes the clients' plain mean update times its
  extrapolated step size (see `process`)."""
  epsilon: float = hparam(1e-3, 'FedExP: epsilon of the server step size eta_g = max(1, '
                                'sum_i ||Delta_i||^2 / (2M (||mean Delta||^2 + epsilon))).',
                          flag='fedexp_epsilon', valid=above(0))
  average_last_two: bool = hparam(False, 'FedExP: evaluate the average of the last two '
                                         'iterates, (x_t + x_{t+1}) / 2, as the paper\'s '
                                         'experiments do (its iterates oscillate).',
                                  flag='fedexp_average_last_two')
  WHY_NOT = groups.why_not({
      groups.CLIENT_OPTIMIZER_FLAGS: 'fedexp clients run plain SGD (Algorithm 1)',
      groups.SERVER_STEP_FLAGS:
      'fedexp sets its server step size itself, eta_g = max(1, ...) each round',
      ('uniform_weighting',): 'fedexp averages the clients equally (Algorithm 1)'})


ALGORITHMS = (Algorithm(
    'fedexp', FedExPConfig, 'build_fedexp',
    'FedExP: FedAvg with the extrapolated server step eta_g = max(1, sum ||Delta_i||^2 / '
    '(2M (||Delta||^2 + eps)))'),)
