"""FedProx's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.algorithms.fedopt.config import FedOptConfig, device_average_server
from tff_algos.core.hparams import at_least, hparam


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedProxConfig(FedOptConfig, groups.DeviceAverage):
  """FedOpt's round on the local objective L_k(theta) + mu/2 ||theta - x_t||^2."""
  mu: float = hparam(0.01, 'FedProx proximal strength mu.', flag='prox_mu', valid=at_least(0))

  def check(self):
    if self.report_device_average:
      device_average_server(self)

  def shared_build_key(self) -> 'FedProxConfig':
    """See `FedOptConfig.shared_build_key` (mu stays: it is a constant, as is
    eta in the device-average round)."""
    return super().shared_build_key(server_in_state=not self.report_device_average)

  def shared_server_learning_rate(self):
    return None if self.report_device_average else super().shared_server_learning_rate()


ALGORITHMS = (Algorithm(
    'fedprox', FedProxConfig, 'build_fedprox',
    'FedProx: FedAvg/FedOpt with proximal term mu/2 ||theta - x_t||^2 (--prox_mu); K steps '
    'or E epochs, any server optimizer'),)
