"""FedProx: FedAvg with a proximal term in the local objective.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in
Heterogeneous Networks" (MLSys 2020); a baseline of paper 003 (FedDyn).

Round t, server model x_t:
  client k:  K steps (or E epochs) of ClientOpt on  L_k(theta) + mu/2 ||theta - x_t||^2
             (gradient grad L_k(theta) + mu (theta - x_t); optionally clipped to a
             global norm, then + weight_decay theta, as paper 003's reference
             code); sends x_t - theta_k
             with weight n_k (its dataset size) or 1
  server:    x_{t+1} = ServerOpt(x_t, weighted mean of the deltas)   (SGD 1: FedProx)

It is FedOpt (`fedopt.client_work`, `core.composition.compose`) with the proximal gradient
term as the local loop's correction, so K steps, epochs and the decaying
schedules of paper 000 apply too.

`report_device_average`: the reported model is the average of all device
models theta_k, paper 003's evaluated model (`fedopt.device_average`, FedAvg's
round with a device model per client, here with the proximal term).

Why not TFF's `build_weighted_fed_prox`: in TFF 0.87 its client work adds
mu (x_t - theta) to the gradient (`proximal_client_work.py`: `mu * (y - x)`
with x the current and y the initial weights), the gradient of
-mu/2 ||theta - x_t||^2, which pushes clients AWAY from x_t. tests/test_fedprox.py
shows ours equals TFF's at mu = 0 and TFF's equals the rule with -mu.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow_federated as tff

from tff_algos.algorithms.fedopt import device_average
from tff_algos.algorithms.fedopt import process as fedopt
from tff_algos.algorithms.fedprox.config import FedProxConfig
from tff_algos.core import accounting
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose


def proximal_correction(mu: float):
  """x_t -> (theta, g) -> g + mu (theta - x_t)."""
  def correction(initial_weights):
    x_t = list(initial_weights.trainable)

    def correction_fn(weights, grads):
      return [g + mu * (w - x) for g, w, x in zip(grads, weights, x_t)]
    return correction_fn
  return correction


def build_fedprox(model_fn: Callable[[], tff.learning.models.VariableModel],
                  config: FedProxConfig = FedProxConfig(),
                  name: str = 'fedprox') -> FederatedAlgorithm:
  correction = proximal_correction(config.mu)
  if config.report_device_average:
    return device_average.build_device_average(
        model_fn, config, name, correction=None if config.mu == 0 else correction,
        optimizer_flops_per_param=2.0 if config.mu == 0 else 5.0)
  work = fedopt.client_work(model_fn, config, correction)
  algorithm = compose(name, model_fn, work, config.server_optimizer_spec().build())
  # Paper 004 App. B, eq. (22): 5 operations per parameter and step with the
  # proximal term (plain SGD: 2).
  return dataclasses.replace(
      algorithm, compute=accounting.ComputeModel(optimizer_flops_per_param=5.0))
