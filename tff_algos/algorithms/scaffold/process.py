"""SCAFFOLD: stochastic controlled averaging (option II control variates).

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning" (ICML 2020), Algorithm 1; a
baseline of paper 003 (FedDyn).

Server state: model x, control variate c (initially 0); client i keeps c_i
(initially 0) between participations. Round t, cohort S, N clients in all:

  client i:  y_0 = x;  y_k = y_{k-1} - gamma (g_i(y_{k-1}) + (c - c_i)),  k = 1..K
             c_i+ = c_i - c + (x - y_K) / (K gamma)          (option II)
             uploads  dy_i = y_K - x,  dc_i = c_i+ - c_i;    c_i <- c_i+
  server:    x <- x + eta_g mean_{i in S} dy_i
             c <- c + (1/N) sum_{i in S} dc_i

Clients download x and c and upload dy and dc: two models each way. K is the
number of steps the client actually took (E epochs: its batches times E).
Optional global-norm clipping of the corrected gradient and l2 weight decay
follow the reference code of paper 003 (`clip_norm`, `weight_decay`);
`report_device_average` reports the plain average of all N device models y_K
(paper 003's evaluated model, `core.device_average`: one more upload).

`reference_conventions` (paper 003's code, where its text is silent): with
w_i = n_i / mean n, the local step uses g + (c / w_i - c_i), the control
variate divides by the INITIAL learning rate (c_i+ = c_i - c + (x - y_K) /
(K gamma_0), also under an lr decay) and the server adds
(1/N) sum w_i (c_i+ - c_i). Equal to the rule above on balanced data
without an lr decay.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.scaffold.config import ScaffoldConfig
from tff_algos.core import algorithm as algorithm_lib
from tff_algos.core import local_training
from tff_algos.core import stateful_process
from tff_algos.core import step_transforms
from tff_algos.core.algorithm import FederatedAlgorithm


def drift(c_i, c):
  """c - c_i: the local step's correction, fixed for the client's whole loop."""
  return [cc - ci for cc, ci in zip(c, c_i)]


def corrected_gradient(config: ScaffoldConfig, grads, weights, correction):
  """g + (c - c_i) (clipped if asked), plus weight decay; `correction` = `drift`.

  The paper writes g - c_i + c. Paper 003's code forms c - c_i once per client
  and adds it at every step, as here: one pass over the model a step instead of
  two, the same sum up to float rounding (docs/papers/paper003.md)."""
  return step_transforms.clip_then_decay(
      [g + d for g, d in zip(grads, correction)], weights, config.clip_norm,
      config.client_weight_decay)


def control_variate_update(c_i, c, delta, num_steps, learning_rate):
  """Option II: c_i+ = c_i - c + (x - y_K) / (K gamma)."""
  scale = tf.cast(num_steps, tf.float32) * tf.cast(learning_rate, tf.float32)
  return [ci - cc + d / scale for ci, cc, d in zip(c_i, c, delta)]


def server_update(config: ScaffoldConfig, x, c, dy_sum, dc_sum, num_clients,
                  total_clients):
  """x += eta_g mean dy;  c += (1/N) sum dc."""
  x = [w + config.server_learning_rate * d / num_clients for w, d in zip(x, dy_sum)]
  c = [cc + d / total_clients for cc, d in zip(c, dc_sum)]
  return x, c


def stateful_fns(config: ScaffoldConfig) -> stateful_process.StatefulFns:
  """SCAFFOLD's server and client steps of the stateful round (see the module docstring)."""
  sgd = tff.learning.optimizers.build_sgdm(config.client_learning_rate)

  def server_init(weights):
    return collections.OrderedDict(c=[tf.zeros_like(w) for w in weights.trainable])

  def broadcast(weights, algorithm_state):
    return collections.OrderedDict(model=weights, c=algorithm_state['c'])

  def client_update(model, message, hparams, dataset, c_i, mean_examples):
    c_i, c = list(c_i), list(message['c'])
    # w_i = 1 unless reference_conventions (then no model-sized scaling at all).
    w_i, cv_learning_rate, c_scaled = None, hparams['learning_rate'], c
    if config.reference_conventions:
      w_i = tf.cast(local_training.count_examples(dataset), tf.float32) / tf.cast(
          mean_examples, tf.float32)
      cv_learning_rate = config.client_learning_rate
      c_scaled = [cc / w_i for cc in c]

    fixed = drift(c_i, c_scaled)

    def correction(weights, grads):
      return corrected_gradient(config, grads, weights, fixed)

    outcome = local_training.run_scheduled(model, sgd, hparams, message['model'], dataset,
                                           correction_fn=correction)
    delta = list(outcome.delta)                    # x - y_K
    new_c_i = control_variate_update(c_i, c, delta, outcome.num_steps, cv_learning_rate)
    dc = [n - o for n, o in zip(new_c_i, c_i)]
    upload = collections.OrderedDict(
        dy=[-d for d in delta], dc=dc if w_i is None else [w_i * d for d in dc])
    return stateful_process.ClientStep(
        upload=upload, new_state=new_c_i, outcome=outcome,
        device_model=[x - d for x, d in zip(message['model'].trainable, delta)])

  def server_step(weights, algorithm_state, upload_sum, num_finite, population):
    x, c = server_update(config, list(weights.trainable), list(algorithm_state['c']),
                         list(upload_sum['dy']), list(upload_sum['dc']),
                         num_finite, population[0])
    return stateful_process.with_trainable(weights, x), collections.OrderedDict(c=c)

  def initial_client_state(weights):
    return [tf.zeros_like(w) for w in weights.trainable]

  return stateful_process.StatefulFns(server_init, broadcast, client_update,
                                      server_step, initial_client_state)


def build_scaffold(model_fn: Callable[[], tff.learning.models.VariableModel],
                   config: ScaffoldConfig = ScaffoldConfig(),
                   name: str = 'scaffold') -> FederatedAlgorithm:
  # Per parameter and step: SGD's 2 plus the correction - c_i + c: 2 more
  # (paper 004 App. B's counting of the paper's rule; c - c_i is formed once
  # per client here, so one of the two is not run at every step).
  return algorithm_lib.build_stateful_algorithm(
      name, model_fn, config.client_schedule(), stateful_fns(config),
      optimizer_flops_per_param=4.0,
      report_device_average=config.report_device_average,
      needs_mean_examples=config.reference_conventions)
