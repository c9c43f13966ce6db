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

It is FedOpt (`fedopt.compose`, our client work) with the proximal gradient
term as the local loop's correction, so K steps, epochs and the decaying
schedules of paper 000 apply too.

`report_device_average` (FedProx, and FedAvg as mu = 0): the reported model is
the average of all device models theta_k, weighted as the server weights
clients (n_k, or 1 with uniform weighting), paper 003's evaluated model. Each
device then keeps theta_k between rounds, so the round is a stateful-client
process (`build_device_average`, `core.device_average`) with the same client
update and a server step x_{t+1} = x_t + eta (weighted mean theta_k - x_t)
(server SGD only).

Why not TFF's `build_weighted_fed_prox`: in TFF 0.87 its client work adds
mu (x_t - theta) to the gradient (`proximal_client_work.py`: `mu * (y - x)`
with x the current and y the initial weights), the gradient of
-mu/2 ||theta - x_t||^2, which pushes clients AWAY from x_t. tests/test_fedprox.py
shows ours equals TFF's at mu = 0 and TFF's equals the rule with -mu.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms import fedopt
from tff_algos.core import accounting
from tff_algos.core import algorithm as algorithm_lib
from tff_algos.core import local_training
from tff_algos.core import stateful_process
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.flags.hparams import HParams


@dataclasses.dataclass(frozen=True)
class FedProxConfig:
  mu: float = 0.01
  fedopt: fedopt.FedOptConfig = fedopt.FedOptConfig()
  report_device_average: bool = False

  def __post_init__(self):
    if not self.mu >= 0:
      raise ValueError(f'fedprox mu must be >= 0, got {self.mu}')
    server = self.fedopt.server_optimizer
    if self.report_device_average and (
        server.name != 'sgd' or server.momentum or self.fedopt.server_lr_decay != 1.0):
      raise ValueError('report_device_average runs FedAvg/FedProx with a plain server '
                       'step: use --server_optimizer=sgd without momentum or '
                       '--server_lr_decay')
    if self.report_device_average and self.fedopt.token_weighting:
      raise ValueError('--token_weighting is not built for --report_device_average')

  def shared_build_key(self) -> 'FedProxConfig':
    """See `FedOptConfig.shared_build_key` (mu stays: it is a constant, as is
    eta in the device-average round)."""
    return dataclasses.replace(self, fedopt=self.fedopt.shared_build_key(
        server_in_state=not self.report_device_average))

  def schedule_values(self):
    return self.fedopt.schedule_values()

  def shared_server_learning_rate(self) -> Optional[float]:
    return None if self.report_device_average else self.fedopt.shared_server_learning_rate()

  @classmethod
  def from_hparams(cls, hp: HParams, mu: Optional[float] = None) -> 'FedProxConfig':
    """`mu`: the proximal strength if not --prox_mu (FedAvg: 0)."""
    return cls(mu=hp.prox_mu if mu is None else mu,
               fedopt=fedopt.FedOptConfig.from_hparams(hp),
               report_device_average=hp.report_device_average)


def proximal_correction(mu: float):
  """x_t -> (theta, g) -> g + mu (theta - x_t)."""
  def correction(initial_weights):
    x_t = list(initial_weights.trainable)

    def correction_fn(weights, grads):
      return [g + mu * (w - x) for g, w, x in zip(grads, weights, x_t)]
    return correction_fn
  return correction


def stateful_fns(config: FedProxConfig) -> stateful_process.StatefulFns:
  """FedProx's round with a device model per client (see the module docstring)."""
  opt = config.fedopt
  optimizer = opt.client_optimizer.build()
  correction = local_training.regularized(
      None if config.mu == 0 else proximal_correction(config.mu),  # mu may be `Lanes`
      opt.weight_decay, opt.clip_norm)
  eta = opt.server_optimizer.learning_rate

  def server_init(weights):
    del weights
    return collections.OrderedDict()

  def broadcast(weights, algorithm_state):
    del algorithm_state
    return weights

  def client_update(model, x_t, hparams, dataset, participations, mean_examples):
    del mean_examples
    outcome = local_training.run_scheduled(
        model, optimizer, hparams, x_t, dataset,
        correction_fn=None if correction is None else correction(x_t))
    weight = (tf.constant(1.0) if opt.uniform_weighting else
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

  return stateful_process.StatefulFns(server_init, broadcast, client_update,
                                      server_update, initial_client_state)


def build_device_average(model_fn: Callable[[], tff.learning.models.VariableModel],
                         config: FedProxConfig, name: str) -> FederatedAlgorithm:
  """FedProx (FedAvg: mu = 0) reporting the average of all device models."""
  weighted = not config.fedopt.uniform_weighting
  return algorithm_lib.build_stateful_algorithm(
      name, model_fn, config.fedopt.client_schedule(), stateful_fns(config),
      optimizer_flops_per_param=2.0 if config.mu == 0 else 5.0, report_device_average=True,
      weighted_device_average=weighted, needs_mean_examples=weighted)


def build_fedprox(model_fn: Callable[[], tff.learning.models.VariableModel],
                  config: FedProxConfig = FedProxConfig(),
                  name: str = 'fedprox') -> FederatedAlgorithm:
  if config.report_device_average:
    return build_device_average(model_fn, config, name)
  work = fedopt.client_work(model_fn, config.fedopt, proximal_correction(config.mu))
  algorithm = fedopt.compose(name, model_fn, work, config.fedopt.server_optimizer.build())
  # Paper 004 App. B, eq. (22): 5 operations per parameter and step with the
  # proximal term (plain SGD: 2).
  return dataclasses.replace(
      algorithm, compute=accounting.ComputeModel(optimizer_flops_per_param=5.0))


def build_fedavg(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedProxConfig = FedProxConfig(mu=0.0),
                 name: str = 'fedavg') -> FederatedAlgorithm:
  """FedAvg as the trainer runs it: FedOpt (`fedopt.build_fedopt`), or FedProx
  with mu = 0 when it reports the device average."""
  if config.mu:
    raise ValueError(f'FedAvg is FedProx with mu = 0, got mu = {config.mu}')
  if config.report_device_average:
    return build_device_average(model_fn, config, name)
  return fedopt.build_fedopt(model_fn, config.fedopt, name=name)
