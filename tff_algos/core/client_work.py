"""A `tff.learning.templates.ClientWorkProcess` around the shared local loop.

Its server state is a *schedule state*: for `ClientSchedule` the round number t
(gamma_t, K_t are functions of t: `schedules`); for a plateau schedule
(LocalUpdateDecay) the ReduceLROnPlateau states. Each round the server derives
the round's client hyperparameters from it, broadcasts them with the model, and
every client runs `local_training.run_local_training`. The algorithm
parameterises the round with hooks: what a client sends back
(`ClientOutputFn`: the FedAvg delta, a Theta-weighted gradient sum, ...), how
each local step's gradient is transformed (`step_transforms.StepTransform`s,
chained), and a value each client measures before training
(`ClientMeasurement`, e.g. LocalUpdateDecay's loss at x_t), averaged by the
server and fed to the schedule's `next_state`.

Measurements per round (`rounds.measurements`): the model's training metrics
(TFF's `sum_then_finalize`), `client_steps` (total local steps taken this
round), `non_finite_clients`, `client_learning_rate`, `local_steps` (K_t),
`server_learning_rate` when the schedule sets it, and the
`ClientMeasurement`'s mean under its name.
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Union

import attr
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core import local_training
from tff_algos.core import rounds
from tff_algos.core import schedules
from tff_algos.core import step_transforms

# (outcome, hparams) -> the update a client uploads (structure of trainable weights).
ClientOutputFn = Callable[[local_training.LocalOutcome, Any], Any]


def model_delta(outcome: local_training.LocalOutcome, hparams) -> Any:
  del hparams
  return outcome.delta


def client_schedule(learning_rate: float, lr_decay: float, local_steps: Optional[int],
                    local_steps_decay: float, epochs: int,
                    server_lr: Optional[schedules.ExponentialDecay] = None) -> 'ClientSchedule':
  """gamma_t = learning_rate * lr_decay^t and K_t from K_0 = local_steps (or
  `epochs` passes when local_steps is None): the schedule every algorithm's
  config builds from its flags."""
  if local_steps is None and local_steps_decay != 1.0:
    raise ValueError('local_steps_decay needs local_steps (K_0)')
  steps = (None if local_steps is None
           else schedules.LocalSteps(local_steps, local_steps_decay))
  return ClientSchedule(learning_rate=schedules.ExponentialDecay(learning_rate, lr_decay),
                        local_steps=steps, epochs=epochs, server_lr=server_lr)


@dataclasses.dataclass(frozen=True)
class ClientSchedule:
  """gamma_t and either K_t local steps or E epochs per round."""

  learning_rate: schedules.ExponentialDecay
  local_steps: Optional[schedules.LocalSteps] = None  # None: epochs mode
  epochs: int = 1
  # eta_t = server_lr(t), set into the server optimiser each round from the
  # round number here, so a rejected (non-finite) round does not shift it.
  server_lr: Optional[schedules.ExponentialDecay] = None

  @property
  def server_learning_rate_fn(self):
    if self.server_lr is None or self.server_lr.constant:
      return None
    return lambda state: self._in(state).server_lr(state['round_num'])

  def __post_init__(self):
    if self.local_steps is None and self.epochs < 1:
      raise ValueError(f'client epochs must be >= 1, got {self.epochs}')

  def state_values(self) -> Optional[collections.OrderedDict]:
    """The schedule's numbers (gamma_0, d_gamma, K_0, d_K, and eta_0, d_eta when
    eta decays) as float64 values kept in its state, so that the computations
    read them from there and one build serves every value (a grid's runs:
    `registry.BuildCache`). None when a schedule is not exponential (step or
    per-lane rates): then its numbers are constants of the computations."""
    parts = [('learning_rate', self.learning_rate), ('local_steps', self.local_steps)]
    if self.server_learning_rate_fn is not None:
      parts.append(('server_lr', self.server_lr))
    values = collections.OrderedDict()
    for name, part in parts:
      if part is None:
        continue
      if type(part) not in (schedules.ExponentialDecay, schedules.LocalSteps):
        return None
      values[name] = np.float64(part.initial)
      values[f'{name}_decay'] = np.float64(part.decay)
    return values

  def initial_state(self):
    state = collections.OrderedDict(round_num=tf.constant(0, tf.int32))
    values = self.state_values()
    if values is not None:
      state['values'] = collections.OrderedDict(
          (k, tf.constant(v, tf.float64)) for k, v in values.items())
    return state

  def _in(self, state) -> 'ClientSchedule':
    """This schedule with the numbers of `state` (tensors) where it keeps them."""
    if 'values' not in state:
      return self
    v = state['values']
    steps = None if self.local_steps is None else schedules.LocalSteps.of_tensors(
        v['local_steps'], v['local_steps_decay'])
    server = None if 'server_lr' not in v else schedules.ExponentialDecay.of_tensors(
        v['server_lr'], v['server_lr_decay'])
    return dataclasses.replace(
        self, learning_rate=schedules.ExponentialDecay.of_tensors(
            v['learning_rate'], v['learning_rate_decay']),
        local_steps=steps, server_lr=server or self.server_lr)

  def hparams(self, state):
    return self._in(state).hparams_at(state['round_num'])

  def next_state(self, state, measured=None):
    """The next round's state (`measured`: a `ClientMeasurement`'s mean, unused)."""
    del measured
    new = collections.OrderedDict(state)
    new['round_num'] = state['round_num'] + 1
    return new

  def hparams_at(self, round_num):
    """The round's broadcast hyperparameters (works on tensors and ints)."""
    if self.local_steps is None:
      num_steps, num_epochs = -1, self.epochs
    else:
      num_steps, num_epochs = self.local_steps(round_num), -1
    return collections.OrderedDict(
        learning_rate=self.learning_rate(round_num),
        num_steps=tf.cast(num_steps, tf.int32) if isinstance(
            round_num, tf.Tensor) else num_steps,
        num_epochs=tf.constant(num_epochs, tf.int32) if isinstance(
            round_num, tf.Tensor) else num_epochs)


def set_schedule_values(state, values):
  """`state` (a learning process's, as Python containers) with the values of
  every `ClientSchedule` state in it replaced by `values` (`state_values()`
  of another schedule of the same build). Raises ValueError if the state
  holds no schedule values or other names."""
  found = []

  def replace(node):
    if isinstance(node, collections.abc.Mapping):
      items = {k: replace(v) for k, v in node.items()}
      if 'round_num' in node and 'values' in node:
        old = node['values']
        if list(old) != list(values):
          raise ValueError(f'schedule values {list(values)} do not fit the build\'s '
                           f'{list(old)}')
        items['values'] = type(old)((k, np.float64(values[k])) for k in old)
        found.append(True)
      return type(node)(items)  # `items` kept the node's order
    if attr.has(type(node)):
      return attr.evolve(node, **{f.name: replace(getattr(node, f.name))
                                  for f in attr.fields(type(node)) if f.init})
    if isinstance(node, tuple) and hasattr(node, '_fields'):
      return type(node)(*(replace(v) for v in node))
    if isinstance(node, (list, tuple)):
      return type(node)(replace(v) for v in node)
    return node

  new = replace(state)
  if not found:
    raise ValueError('the state holds no schedule values to set')
  return new


class ClientWork(NamedTuple):
  """The process, and the per-client computation it maps (for accounting:
  its parameter is what a client downloads, its result what it uploads), and
  the server learning rate its schedule dictates (None: the optimiser's own)."""
  process: tff.learning.templates.ClientWorkProcess
  client_computation: tff.Computation
  server_learning_rate_fn: Optional[Callable[[Any], tf.Tensor]] = None


@dataclasses.dataclass(frozen=True)
class ClientMeasurement:
  """A value each client measures before training (e.g. its loss at x_t).

  measure(model, initial_weights, dataset) -> (value, weight), float32
  scalars. The server takes the mean (weighted by `weight` when clients are
  weighted by their examples), reports it under `name` and passes it to the
  schedule's `next_state(state, mean)`. It must leave the model's metrics
  reset, so that training metrics count training only.
  """
  name: str
  measure: Callable[[Any, Any, tf.data.Dataset], tuple[tf.Tensor, tf.Tensor]]


def _client_fn(client_optimizer, output_fn, transform, correction, before_training,
               weight_fn):
  """A client's round: (model, hparams, x_t, dataset) -> (ClientResult,
  metrics, stats)."""
  base_hparams = client_optimizer.get_hparams(
      client_optimizer.initialize(tf.TensorSpec((), tf.float32)))

  def client_fn(model, hparams, initial_weights, dataset):
    if before_training is not None:
      measured = before_training.measure(model, initial_weights, dataset)
    opt_hparams = collections.OrderedDict(base_hparams)
    opt_hparams[tff.learning.optimizers.LEARNING_RATE_KEY] = tf.cast(
        hparams['learning_rate'], tf.float32)
    outcome = local_training.run_local_training(
        model, client_optimizer, opt_hparams, initial_weights, dataset,
        hparams['num_steps'], hparams['num_epochs'], transform=transform,
        correction_fn=None if correction is None else correction(initial_weights))
    kept = rounds.drop_if_non_finite(
        model, rounds.ClientStep(output_fn(outcome, hparams), (), outcome),
        weight_fn=None if weight_fn is None else weight_fn(dataset, outcome))
    stats = kept.stats
    if before_training is not None:
      stats['measured'] = measured[0]
      stats['measured_weight'] = measured[1]
    return (tff.learning.templates.ClientResult(update=kept.upload, update_weight=kept.weight),
            model.report_local_unfinalized_metrics(), stats)
  return client_fn


def build_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer: tff.learning.optimizers.Optimizer,
    schedule: ClientSchedule,
    *,
    client_weighting: Union[tff.learning.ClientWeighting, str] = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    output_fn: ClientOutputFn = model_delta,
    transform: Optional[step_transforms.StepTransform] = None,
    correction: Optional[Callable[[Any], step_transforms.CorrectionFn]] = None,
    before_training: Optional[ClientMeasurement] = None,
) -> ClientWork:
  """Client work running the shared local loop under a round schedule.

  Args:
    model_fn: no-arg callable returning a fresh `VariableModel`.
    client_optimizer: `tff.learning.optimizers.Optimizer` run on clients; its
      learning rate is replaced each round by gamma_t.
    schedule: the round schedule of gamma and K (or epochs).
    client_weighting: NUM_EXAMPLES (the client's dataset size n_i), UNIFORM, or
      `rounds.TOKENS` (its non-padding target tokens, `rounds.tokens_weight`).
    output_fn: picks the uploaded update from the loop's outcome.
    transform: a transform of each step's raw gradient (e.g. LocalUpdate's
      Theta-weighted sum); its final state is the outcome's `transform_state`.
    correction: optional `initial_weights -> correction_fn` changing the local
      objective's gradient after `transform` (e.g. FedProx's mu (theta - x_t)).
    before_training: a value each client measures at x_t before training.
  """
  types = rounds.model_types(model_fn)
  by_examples = client_weighting != tff.learning.ClientWeighting.UNIFORM
  weight_fn = {tff.learning.ClientWeighting.NUM_EXAMPLES: rounds.examples_weight,
               rounds.TOKENS: rounds.tokens_weight}.get(client_weighting)

  @tff.tensorflow.computation
  def initial_state():
    return schedule.initial_state()

  state_type = initial_state.type_signature.result

  @tff.tensorflow.computation(state_type)
  def round_hparams(state):
    return schedule.hparams(state)

  if before_training is None:
    @tff.tensorflow.computation(state_type)
    def next_state(state):
      return schedule.next_state(state)
  else:
    @tff.tensorflow.computation(state_type, tf.float32)
    def next_state(state, measured):
      return schedule.next_state(state, measured)

  server_lr_fn = getattr(schedule, 'server_learning_rate_fn', None)
  server_lr = (None if server_lr_fn is None
               else tff.tensorflow.computation(server_lr_fn, state_type))

  client_fn = _client_fn(client_optimizer, output_fn, transform, correction,
                         before_training, weight_fn)

  @tff.tensorflow.computation(round_hparams.type_signature.result, types.weights, types.data)
  def client_update(hparams, initial_weights, dataset):
    return rounds.run_client(model_fn, client_fn, hparams, initial_weights, dataset)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(types.weights, tff.CLIENTS),
                             tff.FederatedType(types.data, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    hparams = tff.federated_map(round_hparams, state)
    result, model_metrics, stats = tff.federated_map(
        client_update, (tff.federated_broadcast(hparams), weights, client_data))
    measurements = rounds.measurements(
        types.aggregate_metrics, model_metrics, stats, hparams.learning_rate,
        local_steps=hparams.num_steps)
    if server_lr is not None:
      measurements['server_learning_rate'] = tff.federated_map(server_lr, state)
    if before_training is None:
      new_state = tff.federated_map(next_state, state)
    else:
      mean = tff.federated_mean(stats.measured,
                                weight=stats.measured_weight if by_examples else None)
      measurements[before_training.name] = mean
      new_state = tff.federated_map(next_state, (state, mean))
    return tff.templates.MeasuredProcessOutput(
        new_state, result, tff.federated_zip(measurements))

  return ClientWork(tff.learning.templates.ClientWorkProcess(init_fn, next_fn),
                    client_update, server_lr_fn)
