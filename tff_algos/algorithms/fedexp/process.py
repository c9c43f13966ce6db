"""FedExP: federated averaging with an extrapolated server step size.

Jhunjhunwala, Wang, Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation" (ICLR 2023), Algorithm 1. Not one of the five papers: a
companion of paper 001's server step sizes, and the worked example of adding
an algorithm (its package and its test, one registry line).

Round t, server model x_t, cohort S_t of M clients:
  client i:  K_t steps (or E epochs) of SGD at gamma from x_t to y_i
             sends  Delta_i = x_t - y_i  and  ||Delta_i||^2
  server:    Delta = (1/M) sum_i Delta_i
             eta_g = max(1, sum_i ||Delta_i||^2 / (2 M (||Delta||^2 + epsilon)))
             x_{t+1} = x_t - eta_g Delta
eta_g is 1 when the clients agree (then ||Delta||^2 = ||Delta_i||^2 and the
ratio is 1/2: FedAvg) and grows with their disagreement, as POCS's
extrapolation does. It is reported every round as `aggregator/server_step_size`.
The iterates oscillate; the paper's experiments evaluate the average of the
last two, (x_t + x_{t+1}) / 2: `average_last_two` (`process.get_model_weights`
then returns it).

It is FedOpt's client work (`fedopt.client_work`: plain SGD, equal weights)
with one more upload, the squared norm, and an aggregator (`ExtrapolatedMean`)
that takes TFF's mean of both and scales the mean update by eta_g; the
finalizer applies it with server SGD at 1.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fedexp.config import FedExPConfig
from tff_algos.algorithms.fedopt import FedOptConfig
from tff_algos.algorithms.fedopt import process as fedopt
from tff_algos.core import hparams
from tff_algos.core import optimizers
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose


def squared_norm(structure) -> tf.Tensor:
  return tf.add_n([tf.reduce_sum(tf.square(x)) for x in tf.nest.flatten(structure)])


def delta_and_squared_norm(outcome, hparams_) -> collections.OrderedDict:
  """A client's upload: Delta_i = x_t - y_i and ||Delta_i||^2."""
  del hparams_
  return collections.OrderedDict(delta=outcome.delta,
                                 squared_norm=squared_norm(outcome.delta))


def server_step_size(mean_squared_norm, mean_delta, epsilon: float) -> tf.Tensor:
  """eta_g = max(1, mean_i ||Delta_i||^2 / (2 (||Delta||^2 + epsilon)))."""
  return tf.maximum(1.0, mean_squared_norm / (2.0 * (squared_norm(mean_delta) + epsilon)))


class ExtrapolatedMean(tff.aggregators.WeightedAggregationFactory):
  """(Delta_i, ||Delta_i||^2) with weights 1 -> eta_g Delta: TFF's mean
  (`MeanFactory`) of the uploads, then the step size of their two means."""

  def __init__(self, epsilon: float):
    self._epsilon = epsilon

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    mean = tff.aggregators.MeanFactory().create(value_type, weight_type)
    epsilon = self._epsilon

    @tff.tensorflow.computation(mean.next.type_signature.result.result.member)
    def extrapolate(means):
      eta = server_step_size(means['squared_norm'], means['delta'], epsilon)
      return tf.nest.map_structure(lambda d: eta * d, means['delta']), eta

    @tff.federated_computation(mean.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      output = mean.next(state, value, weight)
      update, eta = tff.federated_map(extrapolate, output.result)
      return tff.templates.MeasuredProcessOutput(
          output.state, update,
          tff.federated_zip(collections.OrderedDict(server_step_size=eta)))

    return tff.templates.AggregationProcess(mean.initialize, next_fn)


def average_last_two(process: tff.learning.templates.LearningProcess
                     ) -> tff.learning.templates.LearningProcess:
  """`process` whose model (`get_model_weights`) is the average of its last two
  iterates, (x_t + x_{t+1}) / 2; the state keeps x_t beside the process's own."""
  weights_type = process.get_model_weights.type_signature.result
  data_type = process.next.type_signature.parameter[1]

  @tff.federated_computation()
  def initialize():
    state = process.initialize()
    return tff.federated_zip(collections.OrderedDict(
        inner=state, previous=tff.federated_map(process.get_model_weights, state)))

  state_type = initialize.type_signature.result

  @tff.federated_computation(state_type, data_type)
  def next_fn(state, data):
    output = process.next(state.inner, data)
    previous = tff.federated_map(process.get_model_weights, state.inner)
    return tff.learning.templates.LearningProcessOutput(
        tff.federated_zip(collections.OrderedDict(inner=output.state, previous=previous)),
        output.metrics)

  @tff.tensorflow.computation(state_type.member)
  def get_model_weights(state):
    last = process.get_model_weights(state['inner'])
    return tf.nest.map_structure(lambda a, b: (a + b) / 2, last, state['previous'])

  @tff.tensorflow.computation(state_type.member, weights_type)
  def set_model_weights(state, weights):
    return collections.OrderedDict(inner=process.set_model_weights(state['inner'], weights),
                                   previous=weights)

  return tff.learning.templates.LearningProcess(initialize, next_fn, get_model_weights,
                                                set_model_weights)


def build_fedexp(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedExPConfig = FedExPConfig(),
                 name: str = 'fedexp') -> FederatedAlgorithm:
  sgd = hparams.convert(config, FedOptConfig, uniform_weighting=True)  # plain SGD, 1/M
  work = fedopt.client_work(model_fn, sgd, output_fn=delta_and_squared_norm)
  algorithm = compose(name, model_fn, work, optimizers.OptimizerSpec('sgd', 1.0).build(),
                      ExtrapolatedMean(config.epsilon))
  if not config.average_last_two:
    return algorithm
  return FederatedAlgorithm(name=name, process=average_last_two(algorithm.process),
                            traffic=algorithm.traffic, compute=algorithm.compute)
