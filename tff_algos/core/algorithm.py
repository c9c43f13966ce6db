"""What every algorithm builder returns: a TFF learning process plus the facts
the trainer needs about it (cost per client, how to read its model)."""

from __future__ import annotations

import dataclasses

import tensorflow_federated as tff

from tff_algos.core import accounting


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  name: str
  process: tff.learning.templates.LearningProcess
  traffic: accounting.ClientTraffic
  compute: accounting.ComputeModel = accounting.ComputeModel()
  # True: `process` is a `core.stateful_process.StatefulLearningProcess` whose
  # per-client state the trainer keeps in a `core.client_state.ClientStateStore`
  # (FedDyn, SCAFFOLD); its `traffic` excludes that state (it stays on clients).
  stateful_clients: bool = False
