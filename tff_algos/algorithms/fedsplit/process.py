"""FedSplit: federated optimisation by Peaceman-Rachford operator splitting.

Pathak & Wainwright, "FedSplit: an algorithmic framework for fast federated
optimization" (NeurIPS 2020), Algorithm 1; a baseline of paper 003 (FedDyn,
App. A.4 and Fig. 2), which adapts it to partial participation.

The problem is min_x sum_i f_i(x), f_i client i's loss. Client i keeps z_i
(z_i^0 = x_0) between participations. Round t, server model x_t, cohort S_t,
m clients in all, step size s:

  client i in S_t:
    v_i            = 2 x_t - z_i^t
    z_i^{t+1/2}    = prox_{s f_i}(v_i) = argmin_w  f_i(w) + ||w - v_i||^2 / (2s)
                     (inexactly: K steps (or E epochs) of SGD at gamma from v_i,
                      gradient grad f_i(w) + (w - v_i) / s)
    z_i^{t+1}      = z_i^t + 2 (z_i^{t+1/2} - x_t)                 (client state)
  client i not in S_t:  z_i^{t+1} = z_i^t
  server:
    active:  x_{t+1} = mean_{i in S_t} z_i^{t+1}           (paper 003's FedSplit Act)
    all:     x_{t+1} = (1/m) sum_{i=1..m} z_i^{t+1}        (paper 003's FedSplit All)

Under full participation both are Pathak & Wainwright's x_{t+1} = mean_i
z_i^{t+1}; with an exact prox its fixed points are the minimisers of sum_i f_i
(their Proposition 1). `active` uploads z_i^{t+1}; `all` uploads
z_i^{t+1} - z_i^t and the server steps x_{t+1} = x_t + (1/m) sum_{i in S_t}
(z_i^{t+1} - z_i^t), which is (1/m) sum_i z_i^{t+1} because x_0 = mean_i z_i^0
(paper 003 freezes a non-sampled client's z_i, so its term is 0). Either way
one model goes up and one down; z_i never leaves the client (the trainer keeps
it in its disk-backed store). Paper 003 also freezes z_i^{t+1/2}, which the
recursion never reads again, so it is not kept.

`clip_norm` clips the local gradient (prox term included) to a global norm and
`client_weight_decay` then adds weight_decay w (`step_transforms.clip_then_decay`,
paper 003's order for all its methods). A client whose update is non-finite is
left out and keeps z_i.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fedsplit.config import FedSplitConfig
from tff_algos.core import algorithm as algorithm_lib
from tff_algos.core import local_training
from tff_algos.core import stateful_process
from tff_algos.core import step_transforms
from tff_algos.core.algorithm import FederatedAlgorithm


def prox_centre(x_t, z_i):
  """v_i = 2 x_t - z_i: the reflection of z_i through x_t, the prox's centre."""
  return [2.0 * x - z for x, z in zip(x_t, z_i)]


def prox_gradient(config: FedSplitConfig, grads, weights, centre):
  """grad f_i(w) + (w - v_i) / s (clipped if asked), plus weight decay."""
  total = [g + (w - v) / config.step_size for g, w, v in zip(grads, weights, centre)]
  return step_transforms.clip_then_decay(total, weights, config.clip_norm,
                                        config.client_weight_decay)


def reflect(z_i, z_half, x_t):
  """z_i^{t+1} = z_i^t + 2 (z_i^{t+1/2} - x_t)."""
  return [z + 2.0 * (h - x) for z, h, x in zip(z_i, z_half, x_t)]


def server_update(config: FedSplitConfig, x_t, upload_sum, num_clients, total_clients):
  """active: x_{t+1} = sum z_i^{t+1} / |S_t|;  all: x_t + sum (z_i^{t+1} - z_i^t) / m."""
  if config.server_average == 'active':
    return [z / num_clients for z in upload_sum]
  return [x + d / total_clients for x, d in zip(x_t, upload_sum)]


def stateful_fns(config: FedSplitConfig) -> stateful_process.StatefulFns:
  """FedSplit's server and client steps of the stateful round (see the module docstring)."""
  sgd = tff.learning.optimizers.build_sgdm(config.client_learning_rate)

  def client_update(model, server_weights, hparams, dataset, z_i, mean_examples):
    del mean_examples
    z_i, x_t = list(z_i), list(server_weights.trainable)
    centre = prox_centre(x_t, z_i)
    start = tff.learning.models.ModelWeights(
        trainable=centre, non_trainable=list(server_weights.non_trainable))

    def correction(weights, grads):
      return prox_gradient(config, grads, weights, centre)

    outcome = local_training.run_scheduled(model, sgd, hparams, start, dataset,
                                           correction_fn=correction)
    z_half = [v - d for v, d in zip(centre, outcome.delta)]   # the prox's solution
    z_new = reflect(z_i, z_half, x_t)
    upload = (z_new if config.server_average == 'active'
              else [n - z for n, z in zip(z_new, z_i)])
    return stateful_process.ClientStep(upload=upload, new_state=z_new, outcome=outcome,
                                       device_model=z_half)

  def server_step(weights, algorithm_state, upload_sum, num_finite, population):
    x = server_update(config, list(weights.trainable), list(upload_sum), num_finite,
                      population[0])
    return stateful_process.with_trainable(weights, x), algorithm_state

  def initial_client_state(weights):
    return [tf.identity(w) for w in weights.trainable]     # z_i^0 = x_0

  return stateful_process.StatefulFns(stateful_process.no_server_state,
                                      stateful_process.broadcast_model, client_update,
                                      server_step, initial_client_state)


def build_fedsplit(model_fn: Callable[[], tff.learning.models.VariableModel],
                   config: FedSplitConfig = FedSplitConfig(),
                   name: str = 'fedsplit') -> FederatedAlgorithm:
  # Per parameter and step: SGD's 2 plus the prox term g + (w - v)/s: 3 more
  # (FedProx's count, paper 004 App. B).
  return algorithm_lib.build_stateful_algorithm(
      name, model_fn, config.client_schedule(), stateful_fns(config),
      optimizer_flops_per_param=5.0)
