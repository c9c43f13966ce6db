"""FedNova's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedNovaConfig(groups.LocalSchedule, groups.ServerRate, groups.ServerDecay):
  """FedNova's round: FedOpt's schedule (gamma, K or E, their decays, eta)
  with plain SGD on clients and server and clients weighted by n_i."""
  WHY_NOT = groups.why_not({
      (*groups.CLIENT_OPTIMIZER_FLAGS, *groups.SERVER_OPTIMIZER_FLAGS, 'uniform_weighting'):
      'fednova runs plain SGD on clients and server, clients weighted by n_i'})


ALGORITHMS = (Algorithm(
    'fednova', FedNovaConfig, 'build_fednova',
    'FedNova: local SGD updates normalised by their steps tau_i, server step eta tau_eff'),)
