"""FedAvg (and FedProx) reporting the average of all device models.

Paper 003 evaluates the average of all device models theta_k, weighted as the
server weights clients (n_k, or 1 with uniform weighting). Each device then
keeps theta_k between rounds, so the round is a stateful-client process
(`core.stateful_process`, `core.device_average`) with FedOpt's client update
(FedProx: with its proximal term) and a server step

    x_{t+1} = x_t + eta (weighted mean theta_k - x_t)      (server SGD only).
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fedopt.config import FedOptConfig
from tff_algos.core import algorithm as algorithm_lib
from tff_algos.core import local_training
from tff_algos.core import stateful_process
from tff_algos.core import step_transforms
from tff_algos.core.algorithm import FederatedAlgorithm


def stateful_fns(config: FedOptConfig, correction=None) -> stateful_process.StatefulFns:
  """FedAvg's round with a device model per client (see the module docstring);
  `correction`: x_t -> the local gradient's correction (FedProx's term)."""
  optimizer = config.client_optimizer_spec().build()
  correction = step_transforms.regularized(correction, config.client_weight_decay,
                                          config.clip_norm)
  eta = config.server_learning_rate

  def client_update(model, x_t, hparams, dataset, participations, mean_examples):
    del mean_examples
    outcome = local_training.run_scheduled(
        model, optimizer, hparams, x_t, dataset,
        correction_fn=None if correction is None else correction(x_t))
    weight = (tf.constant(1.0) if config.uniform_weighting else
              tf.cast(local_training.examples_per_pass(dataset, outcome), tf.float32))
    upload = collections.OrderedDict(delta=[-weight * d for d in outcome.delta],
                                     weight=weight)
    return stateful_process.ClientStep(
        upload=upload, new_state=participations + 1.0, outcome=outcome,
        device_model=[x - d for x, d in zip(x_t.trainable, outcome.delta)])

  def server_update(weights, algorithm_state, upload_sum, num_finite, population):
    del num_finite, population
    total = tf.maximum(upload_sum['weight'], 1e-12)
    x = [w + eta * d / total for w, d in zip(weights.trainable, upload_sum['delta'])]
    return stateful_process.with_trainable(weights, x), algorithm_state

  def initial_client_state(weights):   # the device's number of participations
    del weights
    return tf.constant(0.0)

  return stateful_process.StatefulFns(stateful_process.no_server_state,
                                      stateful_process.broadcast_model, client_update,
                                      server_update, initial_client_state)


def build_device_average(model_fn: Callable[[], tff.learning.models.VariableModel],
                         config: FedOptConfig, name: str, correction=None,
                         optimizer_flops_per_param: float = 2.0) -> FederatedAlgorithm:
  """FedAvg (FedProx: with its `correction`) reporting the average of all
  device models."""
  weighted = not config.uniform_weighting
  return algorithm_lib.build_stateful_algorithm(
      name, model_fn, config.client_schedule(), stateful_fns(config, correction),
      optimizer_flops_per_param=optimizer_flops_per_param, report_device_average=True,
      weighted_device_average=weighted, needs_mean_examples=weighted)
