"""Distributor + client work + aggregator + finalizer, as one learning process.

`compose` is what every algorithm with a server optimiser is: TFF's broadcast
distributor, its client work, a weighted mean (or another aggregator) and an
apply-optimizer finalizer (`core.finalizer`), composed by TFF's
`compose_learning_process`, or by `compose_with_server_lr` when the client
work's schedule sets the server learning rate.

`compose_with_server_lr`: TFF's composition with a client-work -> finalizer
learning-rate link.

TFF's `tff.learning.templates.compose_learning_process` keeps the four
processes' states independent. LocalUpdateDecay needs the server optimiser's
learning rate to follow a plateau rule that lives in the client work's state
(it watches the clients' pre-training loss). This composition is TFF's, plus
one step before the finalizer:

    eta_t = server_learning_rate_fn(client_work_state_t)
    finalizer_state = finalizer.set_hparams(finalizer_state, {learning_rate: eta_t})

so the finalizer is an apply-optimizer finalizer (TFF's, or `core.finalizer`'s
copy of it) with any optimiser, and the state is TFF's `LearningAlgorithmState`
(the result works with `get_model_weights`, `set_model_weights` and checkpoints
as usual).
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core import accounting
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import finalizer as finalizer_lib
from tff_algos.core.algorithm import FederatedAlgorithm

LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState


def compose_with_server_lr(
    initial_model_weights_fn: tff.Computation,
    distributor: tff.learning.templates.DistributionProcess,
    client_work: tff.learning.templates.ClientWorkProcess,
    aggregator: tff.templates.AggregationProcess,
    finalizer: tff.learning.templates.FinalizerProcess,
    server_learning_rate_fn: Callable[[object], tf.Tensor],
) -> tff.learning.templates.LearningProcess:
  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(), client_work.initialize(),
        aggregator.initialize(), finalizer.initialize()))

  state_type = init_fn.type_signature.result.member
  finalizer_state_type = state_type.finalizer

  @tff.tensorflow.computation(state_type.client_work, finalizer_state_type)
  def set_server_lr(work_state, finalizer_state):
    hparams = finalizer.get_hparams(finalizer_state)
    hparams = collections.OrderedDict(hparams)
    hparams[tff.learning.optimizers.LEARNING_RATE_KEY] = server_learning_rate_fn(work_state)
    return finalizer.set_hparams(finalizer_state, hparams)

  @tff.federated_computation(init_fn.type_signature.result, data_type)
  def next_fn(state, client_data):
    dist = distributor.next(state.distributor, state.global_model_weights)
    work = client_work.next(state.client_work, dist.result, client_data)
    agg = aggregator.next(state.aggregator, work.result.update,
                          work.result.update_weight)
    finalizer_state = tff.federated_map(set_server_lr,
                                        (state.client_work, state.finalizer))
    fin = finalizer.next(finalizer_state, state.global_model_weights, agg.result)
    new_state = tff.federated_zip(LearningAlgorithmState(
        fin.result, dist.state, work.state, agg.state, fin.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=dist.measurements, client_work=work.measurements,
        aggregator=agg.measurements, finalizer=fin.measurements))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, state_type.global_model_weights)
  def set_model_weights(state, weights):
    return LearningAlgorithmState(weights, state.distributor, state.client_work,
                                  state.aggregator, state.finalizer)

  return tff.learning.templates.LearningProcess(init_fn, next_fn, get_model_weights,
                                                set_model_weights)


def initial_weights_computation(model_fn) -> tff.Computation:
  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())
  return initial_weights


def compose(name: str, model_fn, work: client_work_lib.ClientWork,
            server_optimizer: tff.learning.optimizers.Optimizer,
            aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
            ) -> FederatedAlgorithm:
  """Distributor + client work + weighted mean + optimiser finalizer.

  If the client work's schedule dictates the server learning rate
  (`work.server_learning_rate_fn`: a decaying eta_t, a plateau rule), it is set
  into the optimiser each round (`compose_with_server_lr`).
  """
  initial_weights = initial_weights_computation(model_fn)
  weights_type = initial_weights.type_signature.result
  result_type = work.process.next.type_signature.result.result.member
  aggregator = (aggregator or tff.aggregators.MeanFactory()).create(
      result_type.update, result_type.update_weight)
  parts = (initial_weights,
           tff.learning.templates.build_broadcast_process(weights_type),
           work.process, aggregator,
           finalizer_lib.build_apply_optimizer_finalizer(server_optimizer, weights_type))
  if work.server_learning_rate_fn is None:
    process = tff.learning.templates.compose_learning_process(*parts)
  else:
    process = compose_with_server_lr(*parts, work.server_learning_rate_fn)
  return FederatedAlgorithm(
      name=name, process=process,
      traffic=accounting.client_traffic(work.client_computation, weights_type))
