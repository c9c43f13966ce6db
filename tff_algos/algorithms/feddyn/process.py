"""FedDyn: federated learning with dynamic regularisation.

Paper 003: Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated
Learning Based on Dynamic Regularization" (ICLR 2021), Algorithm 1.

Client k keeps g_k = grad L_k(theta_k) (initially 0) between participations.
Round t, server model theta_{t-1}, cohort P_t, m clients in all:

  client k:  theta_k^t = argmin_theta  L_k(theta) - <g_k, theta>
                                        + alpha/2 ||theta - theta_{t-1}||^2
             (inexactly: local SGD, gradient grad L_k(theta) - g_k
              + alpha (theta - theta_{t-1}))
             g_k <- g_k - alpha (theta_k^t - theta_{t-1})        (client state)
             uploads  d_k = theta_k^t - theta_{t-1}
  server:    h_t = h_{t-1} - alpha/m sum_{k in P_t} d_k
             theta_t = mean_{k in P_t} theta_k^t - h_t / alpha

Options of the authors' reference code (alpemreacar/FedDyn), all off by default:
* `adaptive_alpha`: client k uses alpha_k = alpha / (n_k / mean n) in its
  objective and state update (the server keeps alpha);
* `weight_decay_form`: the quadratic is SGD weight decay, so gradient
  clipping sees grad L_k - (g_k + alpha_k theta_{t-1}), the bracket formed once
  per client as in the code, and the step adds (alpha_k + weight_decay) theta
  after clipping; otherwise clipping sees the whole gradient and weight_decay
  theta is added after it;
* `clip_norm`: global-norm clipping of the local gradient (reference: 10);
* `weight_decay`: plain l2 weight decay of the local steps (reference: 1e-3);
* `report_device_average`: the reported (evaluated) model is the plain average
  of ALL m device models theta_k (a never-selected device holds the initial
  model), as the reference code's `all_model` (`core.device_average`: one
  more model uploaded, counted). The server model theta_t itself is
  `process.server_model(state)`.
Clients whose update is non-finite are left out of the mean and keep g_k.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.feddyn.config import FedDynConfig
from tff_algos.core import algorithm as algorithm_lib
from tff_algos.core import local_training
from tff_algos.core import stateful_process
from tff_algos.core import step_transforms
from tff_algos.core.algorithm import FederatedAlgorithm


def _zeros(structure):
  return tf.nest.map_structure(tf.zeros_like, structure)


def linear_term(g_k, server_weights, alpha_k):
  """-(g_k + alpha_k theta_{t-1}): the weight-decay form's constant part of the
  local gradient, formed once per client, as the reference code does
  (`train_feddyn_mdl`: alpha * (local_grad_vector - avg_mdl_param))."""
  return [-(gk + alpha_k * s) for gk, s in zip(g_k, server_weights)]


def local_gradient(config: FedDynConfig, grads, weights, server_weights, g_k,
                   alpha_k, linear=None):
  """The local step's gradient: grad L_k - g_k + alpha_k (theta - theta_{t-1}).

  With `weight_decay_form`, grad L_k + `linear` (`linear_term`, formed once per
  client if given), clipped, then (alpha_k + weight_decay) theta.
  """
  if config.weight_decay_form:  # alpha_k theta joins the (unclipped) decay term
    if linear is None:
      linear = linear_term(g_k, server_weights, alpha_k)
    return step_transforms.clip_then_decay([g + c for g, c in zip(grads, linear)], weights,
                                          config.clip_norm, alpha_k + config.client_weight_decay)
  total = [g - gk + alpha_k * (w - s)
           for g, gk, w, s in zip(grads, g_k, weights, server_weights)]
  return step_transforms.clip_then_decay(total, weights, config.clip_norm,
                                        config.client_weight_decay)


def client_alpha(config: FedDynConfig, count_examples, mean_examples):
  """alpha_k = alpha / (n_k / mean n) (reference code) or alpha.

  `count_examples()` gives n_k; it is called only with adaptive_alpha: the
  count is a pass over the client's data, which then also takes the first of
  its reshuffled epochs, so training would see epochs 2..E+1.
  """
  if not config.adaptive_alpha:
    return tf.constant(config.alpha, tf.float32)
  num_examples = count_examples()
  return config.alpha * tf.cast(mean_examples, tf.float32) / tf.maximum(
      tf.cast(num_examples, tf.float32), 1.0)


def client_state_update(g_k, delta, alpha_k):
  """g_k <- g_k - alpha_k (theta_k^t - theta_{t-1})."""
  return [g - alpha_k * d for g, d in zip(g_k, delta)]


def server_update(config: FedDynConfig, server_weights, h, delta_sum, num_clients,
                  total_clients):
  """h_t = h - alpha/m sum d_k;  theta_t = theta_{t-1} + mean d_k - h_t/alpha."""
  alpha = config.alpha
  h = [hh - alpha / total_clients * d for hh, d in zip(h, delta_sum)]
  theta = [w + d / num_clients - hh / alpha
           for w, d, hh in zip(server_weights, delta_sum, h)]
  return theta, h


def stateful_fns(config: FedDynConfig) -> stateful_process.StatefulFns:
  """FedDyn's server and client steps of the stateful round (see the module docstring)."""
  sgd = tff.learning.optimizers.build_sgdm(config.client_learning_rate)

  def server_init(weights):
    return collections.OrderedDict(h=_zeros(list(weights.trainable)))

  def broadcast(weights, algorithm_state):
    del algorithm_state
    return weights

  def client_update(model, server_weights, hparams, dataset, g_k, mean_examples):
    g_k = list(g_k)
    theta_srv = list(server_weights.trainable)
    alpha_k = client_alpha(config, lambda: local_training.count_examples(dataset),
                           mean_examples)

    linear = (linear_term(g_k, theta_srv, alpha_k) if config.weight_decay_form
              else None)

    def correction(weights, grads):
      return local_gradient(config, grads, weights, theta_srv, g_k, alpha_k, linear)

    outcome = local_training.run_scheduled(model, sgd, hparams, server_weights, dataset,
                                           correction_fn=correction)
    delta = [-d for d in outcome.delta]          # theta_k^t - theta_{t-1}
    return stateful_process.ClientStep(
        upload=delta, new_state=client_state_update(g_k, delta, alpha_k),
        outcome=outcome, device_model=[s + d for s, d in zip(theta_srv, delta)])

  def server_step(weights, algorithm_state, delta_sum, num_finite, population):
    theta, h = server_update(config, list(weights.trainable), list(algorithm_state['h']),
                             list(delta_sum), num_finite, population[0])
    return stateful_process.with_trainable(weights, theta), collections.OrderedDict(h=h)

  def initial_client_state(weights):
    return _zeros(list(weights.trainable))

  return stateful_process.StatefulFns(server_init, broadcast, client_update,
                                      server_step, initial_client_state)


def build_feddyn(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedDynConfig = FedDynConfig(),
                 name: str = 'feddyn') -> FederatedAlgorithm:
  # Per parameter and step: SGD's 2 plus the gradient correction
  # - g_k + alpha (theta - theta_srv): 4 more (paper 004 App. B's counting).
  return algorithm_lib.build_stateful_algorithm(
      name, model_fn, config.client_schedule(), stateful_fns(config),
      optimizer_flops_per_param=6.0,
      report_device_average=config.report_device_average,
      needs_mean_examples=config.adaptive_alpha)
