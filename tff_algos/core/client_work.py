"""A `tff.learning.templates.ClientWorkProcess` around the shared local loop.

Its server state is a *schedule state*: for `ClientSchedule` the round number t
(gamma_t, K_t are functions of t: `schedules`); for a plateau schedule
(LocalUpdateDecay) the ReduceLROnPlateau states. Each round the server derives
the round's client hyperparameters from it, broadcasts them with the model, and
every client runs `local_training.run_local_training` (after measuring its loss
at x_t on its whole dataset, if the schedule asks for it).
What a client sends back is chosen by the algorithm through `ClientOutputFn`
(the FedAvg delta, a Theta-weighted gradient sum, ...), so algorithms that
differ only in that choice share this whole process.

Measurements per round: the model's training metrics (TFF's
`sum_then_finalize`), `client_steps` (total local steps taken this round),
`client_learning_rate`, `local_steps` (K_t), `non_finite_clients`, and
`pre_training_loss` when measured.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core import local_training
from tff_algos.core import schedules

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
  # Also measure each client's loss at x_t before training (a metric only).
  needs_pre_training_loss: bool = False
  # eta_t = server_lr(t), set into the server optimiser each round from the
  # round number here, so a rejected (non-finite) round does not shift it.
  server_lr: Optional[schedules.ExponentialDecay] = None

  @property
  def server_learning_rate_fn(self):
    if self.server_lr is None or self.server_lr.constant:
      return None
    return lambda state: self.server_lr(state['round_num'])

  def __post_init__(self):
    if self.local_steps is None and self.epochs < 1:
      raise ValueError(f'client epochs must be >= 1, got {self.epochs}')

  def initial_state(self):
    return collections.OrderedDict(round_num=tf.constant(0, tf.int32))

  def hparams(self, state):
    return self.hparams_at(state['round_num'])

  def next_state(self, state, pre_training_loss=None):
    del pre_training_loss
    return collections.OrderedDict(round_num=state['round_num'] + 1)

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


class ClientWork(NamedTuple):
  """The process, and the per-client computation it maps (for accounting:
  its parameter is what a client downloads, its result what it uploads), and
  the server learning rate its schedule dictates (None: the optimiser's own)."""
  process: tff.learning.templates.ClientWorkProcess
  client_computation: tff.Computation
  server_learning_rate_fn: Optional[Callable[[Any], tf.Tensor]] = None


def build_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer: tff.learning.optimizers.Optimizer,
    schedule: ClientSchedule,
    *,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    output_fn: ClientOutputFn = model_delta,
    step_weights: Optional[tf.Tensor] = None,
    correction: Optional[Callable[[Any], local_training.CorrectionFn]] = None,
) -> ClientWork:
  """Client work running the shared local loop under a round schedule.

  Args:
    model_fn: no-arg callable returning a fresh `VariableModel`.
    client_optimizer: `tff.learning.optimizers.Optimizer` run on clients; its
      learning rate is replaced each round by gamma_t.
    schedule: the round schedule of gamma and K (or epochs).
    client_weighting: NUM_EXAMPLES (the client's dataset size n_i) or UNIFORM.
    output_fn: picks the uploaded update from the loop's outcome.
    step_weights: Theta for the loop's weighted gradient sum (None: not kept).
    correction: optional `initial_weights -> correction_fn` changing the local
      objective's gradient (e.g. FedProx's mu (theta - x_t)).
  """
  with tf.Graph().as_default():
    whimsy = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(
        whimsy.metric_finalizers())
  weights_type = tff.learning.models.weights_type_from_model(whimsy)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(whimsy.input_spec))
  base_hparams = client_optimizer.get_hparams(
      client_optimizer.initialize(tf.TensorSpec((), tf.float32)))

  pre_loss = schedule.needs_pre_training_loss
  by_examples = client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES

  @tff.tensorflow.computation
  def initial_state():
    return schedule.initial_state()

  state_type = initial_state.type_signature.result

  @tff.tensorflow.computation(state_type)
  def round_hparams(state):
    return schedule.hparams(state)

  if pre_loss:
    @tff.tensorflow.computation(state_type, tf.float32)
    def next_state(state, loss):
      return schedule.next_state(state, loss)
  else:
    @tff.tensorflow.computation(state_type)
    def next_state(state):
      return schedule.next_state(state)

  hparams_type = round_hparams.type_signature.result

  server_lr_fn = getattr(schedule, 'server_learning_rate_fn', None)
  server_lr = (None if server_lr_fn is None
               else tff.tensorflow.computation(server_lr_fn, state_type))

  @tff.tensorflow.computation(hparams_type, weights_type, data_type)
  def client_update(hparams, initial_weights, dataset):
    model = model_fn()
    theta = (None if step_weights is None
             else tf.constant(step_weights, tf.float32))

    @tf.function
    def train(hparams, initial_weights, dataset):
      if pre_loss:  # the loss at x_t, before any local step
        loss_before, examples_before = local_training.mean_loss(
            model, initial_weights, dataset)
      opt_hparams = collections.OrderedDict(base_hparams)
      opt_hparams[tff.learning.optimizers.LEARNING_RATE_KEY] = tf.cast(
          hparams['learning_rate'], tf.float32)
      outcome = local_training.run_local_training(
          model, client_optimizer, opt_hparams, initial_weights, dataset,
          hparams['num_steps'], hparams['num_epochs'], step_weights=theta,
          correction_fn=None if correction is None else correction(initial_weights))
      update = output_fn(outcome, hparams)
      finite = (outcome.finite if update is outcome.delta  # checked in the loop
                else tf.logical_and(outcome.finite, local_training.all_finite(update)))
      if finite:
        # NUM_EXAMPLES weights by the client's dataset size n_i (paper 000,
        # Alg. 1), not by examples processed: with K steps every client
        # processes ~K*B examples whatever its size. (Per epoch the two are
        # proportional, so TFF's FedAvg weights agree.)
        weight = (tf.cast(local_training.examples_per_pass(dataset, outcome), tf.float32)
                  if client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES
                  else tf.constant(1.0))
      else:
        # A diverged client contributes nothing (TFF's convention): its update
        # is zeroed, its weight is 0, and its metrics are dropped.
        update = tf.nest.map_structure(tf.zeros_like, update)
        weight = tf.constant(0.0)
        model.reset_metrics()
      stats = collections.OrderedDict(
          num_steps=outcome.num_steps,
          non_finite=tf.cast(tf.logical_not(finite), tf.int32))
      if pre_loss:
        stats['pre_training_loss'] = loss_before
        stats['pre_training_examples'] = tf.cast(examples_before, tf.float32)
      return (tff.learning.templates.ClientResult(update=update, update_weight=weight),
              model.report_local_unfinalized_metrics(), stats)

    return train(hparams, initial_weights, dataset)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    hparams = tff.federated_map(round_hparams, state)
    result, model_metrics, stats = tff.federated_map(
        client_update, (tff.federated_broadcast(hparams), weights, client_data))
    measurements = collections.OrderedDict(
        train=metrics_aggregation_fn(model_metrics),
        client_steps=tff.federated_sum(stats.num_steps),
        non_finite_clients=tff.federated_sum(stats.non_finite),
        client_learning_rate=hparams.learning_rate,
        local_steps=hparams.num_steps)
    if server_lr is not None:
      measurements['server_learning_rate'] = tff.federated_map(server_lr, state)
    if pre_loss:
      loss = tff.federated_mean(
          stats.pre_training_loss,
          weight=stats.pre_training_examples if by_examples else None)
      measurements['pre_training_loss'] = loss
      new_state = tff.federated_map(next_state, (state, loss))
    else:
      new_state = tff.federated_map(next_state, state)
    return tff.templates.MeasuredProcessOutput(
        new_state, result, tff.federated_zip(measurements))

  return ClientWork(tff.learning.templates.ClientWorkProcess(init_fn, next_fn),
                    client_update, server_lr_fn)
