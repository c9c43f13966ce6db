"""What every algorithm builder returns: a TFF learning process plus the facts
the trainer needs about it (cost per client, how to read its model)."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import tensorflow_federated as tff

from tff_algos.core import accounting
from tff_algos.core import device_average
from tff_algos.core import stateful_process


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  name: str
  process: tff.learning.templates.LearningProcess
  traffic: accounting.ClientTraffic
  compute: accounting.ComputeModel = accounting.ComputeModel()
  # True: `process` is a `core.stateful_process.StatefulLearningProcess` whose
  # per-client state the trainer keeps in a `training.client_state.ClientStateStore`
  # (FedDyn, SCAFFOLD); its `traffic` excludes that state (it stays on clients).
  stateful_clients: bool = False
  # Set by `registry.BuildCache` when this is a shared build run with another
  # config's schedule (gamma_0, d_gamma, K_0, d_K, ...): the trainer writes
  # these into the initial state (`client_work.set_schedule_values`).
  schedule_values: Optional[Mapping[str, float]] = None
  # Likewise the server optimiser's constant learning rate eta, set with the
  # process's `set_hparams` (TFF's: the finalizer's optimizer hparams).
  server_learning_rate: Optional[float] = None


def build_stateful_algorithm(
    name: str, model_fn, schedule, fns, *, optimizer_flops_per_param: float,
    report_device_average: bool = False, weighted_device_average: bool = False,
    needs_mean_examples: bool = False) -> FederatedAlgorithm:
  """A stateful-client algorithm from its round functions
  (`stateful_process.StatefulFns`), reporting the average of all device models
  if asked (`device_average`, n_k-weighted if `weighted_device_average`)."""
  if report_device_average:
    fns = device_average.with_device_average(fns, weighted=weighted_device_average)
  process, traffic = stateful_process.build_stateful_process(
      model_fn, schedule, fns, needs_mean_examples=needs_mean_examples)
  return FederatedAlgorithm(
      name=name, process=process, traffic=traffic, stateful_clients=True,
      compute=accounting.ComputeModel(optimizer_flops_per_param=optimizer_flops_per_param))
