"""The average of all device models, reported in place of the server model.

Paper 003 (FedDyn) evaluates, for every method it compares, the average of ALL
m device models: device k holds theta_k, its model after its last
participation (the initial model until then), and the reported model is

    avg = sum_k w_k theta_k / sum_k w_k,   k over all m devices,

with w_k = 1 (the reference code's FedDyn and SCAFFOLD) or w_k = n_k (its
FedAvg and FedProx). `with_device_average` adds this to any stateful-client
algorithm (`stateful_process.StatefulFns` whose client steps set
`device_model`): each device keeps theta_k in its state and uploads
(w_k / mean w) (theta_k^t - theta_k^old); the server keeps

    avg += (1/m) sum_{k in P_t} (w_k / mean w) (theta_k^t - theta_k^old),

exact because sum_k w_k / mean w = m. That is one more model uploaded per
client and round, counted in the traffic like every upload. The algorithm
itself is unchanged (its server model is `process.server_model(state)`).
"""

from __future__ import annotations

import collections

import tensorflow as tf

from tff_algos.core import local_training
from tff_algos.core import stateful_process


def _relative_weight(weighted: bool, dataset, outcome, mean_examples):
  """w_k / mean w: n_k / mean n (from the training loop's first pass when it
  covered one, `local_training.examples_per_pass`), or 1."""
  if not weighted:
    return tf.constant(1.0, tf.float32)
  n_k = tf.cast(local_training.examples_per_pass(dataset, outcome), tf.float32)
  return n_k / tf.cast(mean_examples, tf.float32)


def with_device_average(fns: stateful_process.StatefulFns,
                        weighted: bool = False) -> stateful_process.StatefulFns:
  """`fns` reporting the (n_k-weighted if `weighted`) average of all device models.

  A weighted average needs the population's mean client size: build the
  process with `needs_mean_examples=True`.
  """

  def server_init(weights):
    return collections.OrderedDict(algorithm=fns.server_init(weights),
                                   device_average=list(weights.trainable))

  def broadcast(weights, state):
    return fns.broadcast(weights, state['algorithm'])

  def client_update(model, message, hparams, dataset, client_state, mean_examples):
    step = fns.client_update(model, message, hparams, dataset, client_state['algorithm'],
                             mean_examples)
    if step.device_model is None:
      raise ValueError('with_device_average needs client steps that set device_model')
    w = _relative_weight(weighted, dataset, step.outcome, mean_examples)
    theta_k = list(step.device_model)
    upload = collections.OrderedDict(
        algorithm=step.upload,
        device=[w * (new - old) for new, old in zip(theta_k, client_state['model'])])
    new_state = collections.OrderedDict(algorithm=step.new_state, model=theta_k)
    return stateful_process.ClientStep(upload=upload, new_state=new_state,
                                       outcome=step.outcome, device_model=theta_k)

  def server_update(weights, state, upload_sum, num_finite, population):
    weights, algorithm = fns.server_update(weights, state['algorithm'],
                                           upload_sum['algorithm'], num_finite, population)
    average = [a + d / population[0]
               for a, d in zip(state['device_average'], upload_sum['device'])]
    return weights, collections.OrderedDict(algorithm=algorithm, device_average=average)

  def initial_client_state(weights):
    return collections.OrderedDict(algorithm=fns.initial_client_state(weights),
                                   model=list(weights.trainable))

  def report_weights(weights, state):
    return stateful_process.with_trainable(weights, list(state['device_average']))

  def set_weights(weights, state):
    algorithm = state['algorithm']
    if fns.set_weights is not None:
      algorithm = fns.set_weights(weights, algorithm)
    return collections.OrderedDict(algorithm=algorithm,
                                   device_average=list(weights.trainable))

  return stateful_process.StatefulFns(server_init, broadcast, client_update,
                                      server_update, initial_client_state,
                                      report_weights, set_weights)
