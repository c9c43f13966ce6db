"""Client work whose server keeps optimiser statistics s_t that clients download.

For the adaptive-FL algorithms of paper 004 (FedGBO, Mimelite, MimeXlite,
MFL). The client work's server state is (schedule state, s_t). Round t:

  server:  hparams = schedule(t) (gamma_t, K_t); broadcast x_t, hparams, s_t
  client:  (Delta_i, e_i) = client_fn(model, hparams, s_t, x_t, data_i)
           uploads Delta_i = x_t - y_K^i (the model) and e_i (Mimelite: a
           gradient; MFL: its optimiser statistics; FedGBO: nothing)
  server:  s_{t+1} = server_fn(s_t, hparams, mean_i Delta_i, mean_i e_i)
           (means weighted like the model: n_i, or 1 with uniform weighting)

The model mean goes through the usual aggregator and finalizer
(`core.composition.compose`: x_{t+1} = x_t - mean Delta with server SGD at 1), so the
algorithms keep TFF's composition (distributor, client work, aggregator,
finalizer) exactly as TFF's own Mime Lite does (its client work also averages
the clients' full gradients and updates the optimiser state it keeps).
FedGBO needs mean Delta itself for its inverse step: the client work
averages the same uploaded Delta_i (no extra upload).

Diverging clients are zeroed with weight 0 (as in `client_work`); if no
client is left or a mean is non-finite, s_t is kept (the finalizer likewise
keeps x_t).
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core import client_work as client_work_lib
from tff_algos.core import local_training
from tff_algos.core import rounds

# (model, hparams, statistics, initial_weights, dataset) -> (LocalOutcome, extra upload)
ClientFn = Callable[..., tuple[local_training.LocalOutcome, Any]]
# (statistics, hparams, mean_delta or None, mean_extra or None) -> statistics
ServerFn = Callable[[Any, Any, Any, Any], Any]


def _is_empty(structure) -> bool:
  return not tf.nest.flatten(structure)


def _client_round(client_fn: ClientFn, by_examples: bool):
  """(model, hparams, s_t, x_t, dataset) -> (ClientResult, extra upload,
  metrics, stats), a diverged client dropped."""
  def train(model, hparams, statistics, initial_weights, dataset):
    outcome, extra = client_fn(model, hparams, statistics, initial_weights, dataset)
    kept = rounds.drop_if_non_finite(
        model, rounds.ClientStep((outcome.delta, extra), (), outcome),
        weight_fn=rounds.examples_weight(dataset, outcome) if by_examples else None)
    update, extra = kept.upload
    return (tff.learning.templates.ClientResult(update=update, update_weight=kept.weight),
            extra, model.report_local_unfinalized_metrics(), kept.stats)
  return train


def _statistics_update(server_fn: ServerFn, old, hparams, total_weight, mean_delta,
                       mean_extra):
  """s_{t+1} = server_fn(...), or s_t if no client was left or a mean or the
  new statistics are non-finite."""
  new = server_fn(old, hparams, mean_delta, mean_extra)
  ok = tf.logical_and(total_weight > 0.0, local_training.all_finite(
      [x for x in (mean_delta, mean_extra) if x is not None]))
  ok = tf.logical_and(ok, local_training.all_finite(
      [t for t in tf.nest.flatten(new) if t.dtype.is_floating]))
  return tf.nest.map_structure(
      lambda n, o: tf.where(ok, n, o), new, tf.nest.pack_sequence_as(
          new, tf.nest.flatten(old)))


def _next_state(schedule, server_fn: ServerFn, server_uses_delta: bool, state_type,
                hparams_type, result_type):
  """The server's state update from the round's means, and whether the
  clients upload an extra structure."""
  update_type, extra_type = result_type[0].update, result_type[1]
  has_extra = not _is_empty(tff.types.type_to_tf_tensor_specs(extra_type))
  mean_types = []
  if server_uses_delta:
    mean_types.append(update_type)
  if has_extra:
    mean_types.append(extra_type)

  if not mean_types:
    raise ValueError('the statistics need mean Delta or an extra client upload')

  @tff.tensorflow.computation(state_type, hparams_type, tf.float32,
                              tff.StructWithPythonType(mean_types, list))
  def next_state(state, hparams, total_weight, means):
    means = list(means)
    mean_delta = means.pop(0) if server_uses_delta else None
    mean_extra = means.pop(0) if has_extra else None
    return collections.OrderedDict(
        schedule=schedule.next_state(state['schedule']),
        statistics=_statistics_update(server_fn, state['statistics'], hparams,
                                      total_weight, mean_delta, mean_extra))
  return next_state, has_extra


def build_statistics_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    schedule: client_work_lib.ClientSchedule,
    initial_statistics: Callable[[Any], Any],
    client_fn: ClientFn,
    server_fn: ServerFn,
    *,
    server_uses_delta: bool,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
) -> client_work_lib.ClientWork:
  """Client work with server-kept statistics (see the module docstring).

  Args:
    model_fn: no-arg callable returning a fresh `VariableModel`.
    schedule: round schedule of gamma_t and K_t (or epochs).
    initial_statistics: specs of the trainable weights -> s_0 (TensorFlow).
    client_fn: the local work; returns the loop's outcome (its `delta` is the
      uploaded model update) and an extra upload (a structure, maybe empty).
    server_fn: the statistics update from the round's means.
    server_uses_delta: whether `server_fn` needs mean Delta (FedGBO).
    client_weighting: NUM_EXAMPLES (dataset size n_i) or UNIFORM.
  """
  types = rounds.model_types(model_fn)
  trainable_specs = tuple(tf.TensorSpec(t.shape, t.dtype)
                          for t in types.weights.trainable)
  by_examples = client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES

  @tff.tensorflow.computation
  def initial_state():
    return collections.OrderedDict(schedule=schedule.initial_state(),
                                   statistics=initial_statistics(trainable_specs))

  state_type = initial_state.type_signature.result

  @tff.tensorflow.computation(state_type)
  def round_hparams(state):
    return schedule.hparams(state['schedule'])

  @tff.tensorflow.computation(state_type)
  def statistics_of(state):
    return state['statistics']

  hparams_type = round_hparams.type_signature.result
  statistics_type = statistics_of.type_signature.result

  train = _client_round(client_fn, by_examples)

  @tff.tensorflow.computation(hparams_type, statistics_type, types.weights, types.data)
  def client_update(hparams, statistics, initial_weights, dataset):
    return rounds.run_client(model_fn, train, hparams, statistics, initial_weights, dataset)

  next_state, has_extra = _next_state(schedule, server_fn, server_uses_delta, state_type,
                                       hparams_type, client_update.type_signature.result)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(types.weights, tff.CLIENTS),
      tff.FederatedType(types.data, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    hparams = tff.federated_map(round_hparams, state)
    statistics = tff.federated_map(statistics_of, state)
    result, extra, model_metrics, stats = tff.federated_map(
        client_update, (tff.federated_broadcast(hparams),
                        tff.federated_broadcast(statistics), weights, client_data))
    weight = result.update_weight
    means = []
    if server_uses_delta:
      means.append(tff.federated_mean(result.update, weight=weight))
    if has_extra:
      means.append(tff.federated_mean(extra, weight=weight))
    new_state = tff.federated_map(next_state, tff.federated_zip(
        (state, hparams, tff.federated_sum(weight), tff.federated_zip(tuple(means)))))
    measurements = rounds.measurements(
        types.aggregate_metrics, model_metrics, stats, hparams.learning_rate,
        local_steps=hparams.num_steps)
    return tff.templates.MeasuredProcessOutput(
        new_state, result, tff.federated_zip(measurements))

  # eta_t from the schedule's part of this client work's state (None: constant).
  schedule_lr = schedule.server_learning_rate_fn
  server_lr = None if schedule_lr is None else lambda state: schedule_lr(state['schedule'])
  return client_work_lib.ClientWork(
      tff.learning.templates.ClientWorkProcess(init_fn, next_fn), client_update, server_lr)
