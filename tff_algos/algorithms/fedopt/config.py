"""FedAvg/FedOpt's and FedSGD's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import hparam, refuse


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedOptConfig(groups.ClientOptimizer, groups.LocalSchedule, groups.ServerOptimizer,
                   groups.ServerDecay, groups.Weighting, groups.LocalRegularization):
  """FedOpt's round (Reddi et al.; paper 000's K_t, gamma_t, eta_t): any client
  and server optimiser, clients weighted by n_i or equally, the local gradient
  optionally clipped and decayed (paper 003's reference code). FedProx, FedMAX
  and the FedAvg of the trainer (`FedAvgConfig`) build on it."""

  # Weighted by non-padding target tokens (FedAvg only: `FedAvgConfig`).
  token_weighting = False

  def client_schedule(self):
    """gamma_t, K_t (or E) and eta_t = eta_0 d_eta^t (TensorFlow: for the builders)."""
    from tff_algos.core import schedules  # pylint: disable=g-import-not-at-top
    return super().client_schedule(server_lr=schedules.ExponentialDecay(
        self.server_learning_rate, self.server_lr_decay))

  def shared_build_key(self, server_in_state: bool = True) -> 'FedOptConfig':
    """This config with the numbers that FedOpt's computations read from the
    state at fixed values: configs with equal keys run on one build
    (`registry.BuildCache`). gamma_0, d_gamma, K_0, d_K are the schedule's
    (`schedule_values`); eta_0 and d_eta too when eta decays, else eta is the
    server optimiser's hparam in TFF's finalizer state
    (`shared_server_learning_rate`; `server_in_state=False`: a constant)."""
    decaying = self.server_lr_decay != 1.0
    server = ({'server_learning_rate': 1.0} if decaying or server_in_state else {})
    return dataclasses.replace(self.shared_schedule_key(), **server,
                               server_lr_decay=0.5 if decaying else 1.0)

  def shared_server_learning_rate(self) -> Optional[float]:
    return None if self.server_lr_decay != 1.0 else self.server_learning_rate


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgConfig(FedOptConfig, groups.DeviceAverage):
  """FedAvg as the trainer runs it: FedOpt, optionally weighting clients by their
  target tokens, or reporting the average of all device models (paper 003's
  evaluated model; a round with a device model per client, server SGD only)."""
  token_weighting: bool = hparam(False, 'fedavg: weight clients by their non-padding target '
                                        "tokens (Reddi et al.'s code for Shakespeare and "
                                        'StackOverflow NWP), not by examples n_i.')

  def check(self):
    if self.uniform_weighting and self.token_weighting:
      raise refuse('{uniform_weighting} and {token_weighting} exclude each other')
    if self.report_device_average:
      device_average_server(self)
      if self.token_weighting:
        raise refuse('{token_weighting} is not built for {report_device_average}')

  def shared_build_key(self) -> 'FedAvgConfig':
    return super().shared_build_key(server_in_state=not self.report_device_average)

  def shared_server_learning_rate(self) -> Optional[float]:
    return None if self.report_device_average else super().shared_server_learning_rate()


def device_average_server(config: FedOptConfig) -> None:
  """The device-average round's server step is plain SGD (FedAvg, FedProx)."""
  if (config.server_optimizer != 'sgd' or config.server_momentum or
      config.server_lr_decay != 1.0):
    raise refuse('{report_device_average} runs FedAvg/FedProx with a plain server step: use '
                 '{server_optimizer}=sgd without momentum or {server_lr_decay}')


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedSGDConfig(groups.ServerOptimizer, groups.ServerDecay, groups.Weighting):
  """FedSGD: each client sends one gradient at x_t, weighted by n_i (or
  equally); the server optimiser steps at eta_t = eta d_eta^t."""
  WHY_NOT = groups.why_not({
      (*groups.CLIENT_OPTIMIZER_FLAGS, 'client_learning_rate', 'local_steps',
       'local_steps_decay', 'client_lr_decay', 'client_epochs_per_round'):
      'fedsgd clients send one gradient at the server model; the server optimizer takes '
      'the step'})


ALGORITHMS = (
    Algorithm('fedavg', FedAvgConfig, 'build_fedavg',
              'FedAvg/FedOpt: K steps or E epochs, any server optimizer'),
    Algorithm('fedsgd', FedSGDConfig, 'build_fedsgd',
              'FedSGD: one gradient per client, server optimizer step'),
)
