"""A round computation with per-client state in and out (stateful clients).

TFF's `LearningProcess.next` is (server_state, client_data) -> output; a
stateful-client algorithm (FedDyn, SCAFFOLD) also needs each sampled client's
own state, which stays on the client between its participations. Here the
round is one federated computation

    next(state@SERVER, data@CLIENTS, client_state@CLIENTS)
        -> <state@SERVER, metrics@SERVER, client_state@CLIENTS>

so the client state is a CLIENTS-placed input and output, and the trainer keeps
it between rounds in a `training.client_state.ClientStateStore` keyed by client id.

One round, for the algorithm's functions (plain TensorFlow, callable without TFF):

    message  = broadcast(server model, server algorithm state)      -> clients
    client:  (upload, new_state) = client_update(model, message, hparams,
                                                 data, client_state, mean n)
    server:  model, algorithm state = server_update(state, sum_i upload_i,
                                                    #finite clients, m)

Client hyperparameters (gamma_t, K_t or epochs) come from a
`client_work.ClientSchedule` indexed by the round number in server state.
A client whose upload or new state is non-finite uploads zeros, counts 0 and
keeps its old state; if no client is finite the server state is unchanged
(apart from the round number). The population (number of clients m, mean
examples per client) is set once at `initialize` and kept in server state.

Communication (`traffic`) comes from the per-client computation's type: its
download is the broadcast message and hyperparameters, its upload the update,
finite flag and metrics; the client state is neither (it never leaves the
client).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core import accounting
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import rounds

# What a client's update function returns: the upload (summed over clients),
# the client's new state, the loop's outcome and the device's model.
ClientStep = rounds.ClientStep


@dataclasses.dataclass(frozen=True)
class StatefulFns:
  """The algorithm-specific parts of a stateful round (plain TensorFlow).

  server_init(model_weights) -> algorithm server state (besides the model).
  broadcast(model_weights, algorithm_state) -> what clients download.
  client_update(model, message, hparams, dataset, client_state, population)
    -> ClientStep; `model` is a fresh VariableModel, `hparams` the schedule's
    (learning_rate, num_steps, num_epochs), `population` = (m, mean n).
  server_update(model_weights, algorithm_state, upload_sum, num_finite,
    population) -> (model_weights, algorithm_state); only called when
    num_finite > 0.
  initial_client_state(model_weights) -> numpy structure (never-selected client).
  Optional: report_weights(model_weights, algorithm_state) -> the weights
  `get_model_weights` reports (evaluated, saved) instead of the server model;
  set_weights(model_weights, algorithm_state) -> algorithm state, applied by
  `set_model_weights` (e.g. to restart a running average at the new model).
  """
  server_init: Callable[[Any], Any]
  broadcast: Callable[[Any, Any], Any]
  client_update: Callable[..., ClientStep]
  server_update: Callable[..., Any]
  initial_client_state: Callable[[Any], Any]
  report_weights: Optional[Callable[[Any, Any], Any]] = None
  set_weights: Optional[Callable[[Any, Any], Any]] = None


def no_server_state(weights) -> collections.OrderedDict:
  """`StatefulFns.server_init` of an algorithm whose server keeps only the model."""
  del weights
  return collections.OrderedDict()


def broadcast_model(weights, algorithm_state):
  """`StatefulFns.broadcast` of an algorithm that sends its clients only the model."""
  del algorithm_state
  return weights


def with_trainable(weights, trainable) -> tff.learning.models.ModelWeights:
  """`weights` (a ModelWeights) with new trainable weights (for server updates)."""
  return tff.learning.models.ModelWeights(trainable=trainable,
                                          non_trainable=list(weights.non_trainable))


@dataclasses.dataclass(frozen=True)
class Population:
  num_clients: int
  mean_examples: float = 1.0

  def __post_init__(self):
    if self.num_clients < 1:
      raise ValueError(f'num_clients must be >= 1, got {self.num_clients}')
    if not self.mean_examples > 0:
      raise ValueError(f'mean_examples must be > 0, got {self.mean_examples}')


class StatefulOutput(NamedTuple):
  state: Any
  metrics: Any
  client_states: list


class StatefulLearningProcess:
  """initialize / next / get_model_weights / set_model_weights, with client state.

  `next(state, client_data, client_states)` returns a `StatefulOutput` whose
  `client_states` are the cohort's new states, in the order of `client_data`.
  """

  def __init__(self, initialize_fn, next_fn, get_model_weights, set_model_weights,
               initial_client_state: Callable[[Any], Any],
               client_state_type: tff.Type, needs_mean_examples: bool,
               server_model: Callable[[Any], Any]):
    self.initialize_fn = initialize_fn
    self.next_fn = next_fn
    self.get_model_weights = get_model_weights
    self.set_model_weights = set_model_weights
    self._initial_client_state = initial_client_state
    self.client_state_type = client_state_type
    self.needs_mean_examples = needs_mean_examples
    self.server_model = server_model   # state -> the server model x_t

  def initialize(self, population: Population):
    """Server state for a population of m clients (with mean size n)."""
    return self.initialize_fn(np.float32(population.num_clients),
                              np.float32(population.mean_examples))

  def initial_client_state(self, state) -> Any:
    """The state of a never-selected client (numpy), given the server state."""
    weights = self.server_model(state)
    return tf.nest.map_structure(lambda a: np.asarray(a, np.float32),
                                 self._initial_client_state(weights))

  def next(self, state, client_data, client_states) -> StatefulOutput:
    if len(client_data) != len(client_states):
      raise ValueError(f'{len(client_data)} client datasets but '
                       f'{len(client_states)} client states')
    state, metrics, new_states = self.next_fn(state, client_data, client_states)
    return StatefulOutput(state, metrics, list(new_states))


def _client_round(fns: StatefulFns):
  """(model, message, dataset, client_state) -> upload, stats, metrics and
  new state, a diverged client dropped (it keeps its state)."""
  def train(model, message, dataset, client_state):
    step = fns.client_update(model, message['server'], message['hparams'], dataset,
                             client_state, message['hparams']['mean_examples'])
    kept = rounds.drop_if_non_finite(model, step, old_state=client_state,
                                     count_finite=True)
    return collections.OrderedDict(
        upload=kept.upload, stats=kept.stats,
        metrics=model.report_local_unfinalized_metrics(), new_state=kept.new_state)
  return train


def _model_accessors(fns: StatefulFns, state_type, weights_type):
  """The server model, the reported model and `set_model_weights`."""
  @tff.tensorflow.computation(state_type)
  def server_model(state):
    return state['model']

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    if fns.report_weights is None:
      return state['model']
    return fns.report_weights(state['model'], state['algorithm'])

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    algorithm = (state['algorithm'] if fns.set_weights is None
                 else fns.set_weights(weights, state['algorithm']))
    return collections.OrderedDict(model=weights, algorithm=algorithm,
                                   schedule=state['schedule'],
                                   population=state['population'])
  return server_model, get_model_weights, set_model_weights


def build_stateful_process(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    schedule: client_work_lib.ClientSchedule,
    fns: StatefulFns,
    *,
    needs_mean_examples: bool = False,
) -> tuple[StatefulLearningProcess, accounting.ClientTraffic]:
  """The TFF computations of a stateful-client algorithm, and its traffic."""
  types = rounds.model_types(model_fn)
  weights_type, data_type = types.weights, types.data

  @tff.tensorflow.computation
  def initial_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  @tff.tensorflow.computation(tf.float32, tf.float32)
  def initialize_fn(num_clients, mean_examples):
    weights = initial_weights_fn()
    return collections.OrderedDict(
        model=weights, algorithm=fns.server_init(weights),
        schedule=schedule.initial_state(),
        population=collections.OrderedDict(num_clients=num_clients,
                                           mean_examples=mean_examples))

  state_type = initialize_fn.type_signature.result

  @tff.tensorflow.computation(state_type)
  def server_message(state):
    hparams = collections.OrderedDict(schedule.hparams(state['schedule']))
    hparams['mean_examples'] = state['population']['mean_examples']
    return collections.OrderedDict(
        server=fns.broadcast(state['model'], state['algorithm']), hparams=hparams)

  message_type = server_message.type_signature.result

  @tff.tensorflow.computation(weights_type)
  def initial_client_state_fn(weights):
    return fns.initial_client_state(weights)

  client_state_type = initial_client_state_fn.type_signature.result

  train = _client_round(fns)

  @tff.tensorflow.computation(message_type, data_type, client_state_type)
  def client_update(message, dataset, client_state):
    return rounds.run_client(model_fn, train, message, dataset, client_state)

  result_type = client_update.type_signature.result
  upload_type = result_type['upload']

  @tff.tensorflow.computation(state_type, upload_type, tf.float32)
  def server_update(state, upload_sum, num_finite):
    population = state['population']
    model, algorithm = tf.cond(
        num_finite > 0,
        lambda: fns.server_update(
            state['model'], state['algorithm'], upload_sum, num_finite,
            (population['num_clients'], population['mean_examples'])),
        lambda: (state['model'], state['algorithm']))
    schedule_state = schedule.next_state(state['schedule'])
    return collections.OrderedDict(model=model, algorithm=algorithm,
                                   schedule=schedule_state, population=population)

  @tff.tensorflow.computation(state_type)
  def client_learning_rate(state):
    return schedule.hparams(state['schedule'])['learning_rate']

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(data_type, tff.CLIENTS),
                             tff.FederatedType(client_state_type, tff.CLIENTS))
  def next_fn(state, client_data, client_states):
    message = tff.federated_map(server_message, state)
    out = tff.federated_map(
        client_update, (tff.federated_broadcast(message), client_data, client_states))
    num_finite = tff.federated_sum(out.stats.finite)
    new_state = tff.federated_map(
        server_update, (state, tff.federated_sum(out.upload), num_finite))
    measurements = rounds.measurements(
        types.aggregate_metrics, out.metrics, out.stats,
        tff.federated_map(client_learning_rate, state))
    metrics = tff.federated_zip(collections.OrderedDict(
        client_work=tff.federated_zip(measurements)))
    return new_state, metrics, out.new_state

  server_model, get_model_weights, set_model_weights = _model_accessors(
      fns, state_type, weights_type)
  process = StatefulLearningProcess(
      initialize_fn, next_fn, get_model_weights, set_model_weights,
      initial_client_state_fn, client_state_type, needs_mean_examples, server_model)
  return process, client_traffic(client_update, weights_type)


def client_traffic(client_update: tff.Computation,
                   weights_type: tff.Type) -> accounting.ClientTraffic:
  """Download: the broadcast message; upload: everything but the new state."""
  sig = client_update.type_signature
  message_type = sig.parameter[0]
  result = sig.result
  upload = sum(accounting.type_bytes(result[name])
               for name in ('upload', 'stats', 'metrics'))
  return accounting.ClientTraffic(
      download_bytes=accounting.type_bytes(message_type), upload_bytes=upload,
      model_bytes=accounting.type_bytes(weights_type.trainable))


def population_of(task, needs_mean_examples: bool) -> Population:
  """(m, mean n) of a task's training clients (n counted only if needed)."""
  ids = task.client_ids
  if not needs_mean_examples:
    return Population(len(ids))
  total = 0
  data = task.train_data
  for cid in ids:
    arrays = getattr(data, 'client_arrays', None)
    if arrays is not None:
      total += len(next(iter(arrays(cid).values())))
    else:
      total += int(data.create_tf_dataset_for_client(cid).reduce(
          np.int64(0), lambda n, _: n + 1))
  return Population(len(ids), max(total / len(ids), 1e-12))
