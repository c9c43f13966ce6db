"""FedNova: FedAvg with updates normalised by each client's number of steps.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization" (NeurIPS 2020), with plain local SGD. Not
one of the five papers.

Round t, server model x_t, cohort S_t:
  client i:  tau_i steps of SGD at gamma_t from x_t to y_i (K_t steps, or E
             passes over its n_i examples: tau_i = E ceil(n_i / B));
             sends  d_i = (x_t - y_i) / tau_i  and tau_i, with weight n_i
  server:    p_i = n_i / sum_j n_j,   tau_eff = sum_i p_i tau_i
             x_{t+1} = x_t - eta_t tau_eff sum_i p_i d_i
With equal tau_i, tau_eff d_i = x_t - y_i and this is FedAvg. With unequal
tau_i, FedAvg's update sum_i p_i tau_i d_i weights client i by p_i tau_i, so
it minimises a surrogate objective that over-weights the clients taking more
steps; FedNova's weights stay p_i.

It is FedOpt (`fedopt.client_work`, `core.composition.compose`) with two
changes: the clients' upload (`normalized_update`) and an aggregator that takes TFF's
weighted mean of (d_i, tau_i) and multiplies the two means. A client with no
data has tau_i = 0, so d_i = 0/0: the client work drops it as non-finite
(weight 0).
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fednova.config import FedNovaConfig
from tff_algos.algorithms.fedopt import FedOptConfig
from tff_algos.algorithms.fedopt import process as fedopt
from tff_algos.core import hparams
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose


def normalized_update(outcome, hparams) -> collections.OrderedDict:
  """A client's upload: d_i = (x_t - y_i) / tau_i and tau_i (float32)."""
  del hparams
  steps = tf.cast(outcome.num_steps, tf.float32)
  return collections.OrderedDict(
      normalized_update=tf.nest.map_structure(lambda d: d / steps, outcome.delta),
      local_steps=steps)


class EffectiveStepsMean(tff.aggregators.WeightedAggregationFactory):
  """(d_i, tau_i) with weights n_i -> tau_eff sum_i p_i d_i: TFF's weighted
  mean (`MeanFactory`) of the uploads, then the product of their two means."""

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    mean = tff.aggregators.MeanFactory().create(value_type, weight_type)

    @tff.tensorflow.computation(mean.next.type_signature.result.result.member)
    def scale(means):
      tau_eff = means['local_steps']
      return tf.nest.map_structure(lambda d: tau_eff * d, means['normalized_update'])

    @tff.federated_computation(mean.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      output = mean.next(state, value, weight)
      return tff.templates.MeasuredProcessOutput(
          output.state, tff.federated_map(scale, output.result), output.measurements)

    return tff.templates.AggregationProcess(mean.initialize, next_fn)


def build_fednova(model_fn: Callable[[], tff.learning.models.VariableModel],
                  config: FedNovaConfig = FedNovaConfig(),
                  name: str = 'fednova') -> FederatedAlgorithm:
  sgd = hparams.convert(config, FedOptConfig)  # FedOpt with plain SGD on clients and server
  work = fedopt.client_work(model_fn, sgd, output_fn=normalized_update)
  return compose(name, model_fn, work, sgd.server_optimizer_spec().build(),
                 EffectiveStepsMean())
