"""LocalUpdate and LocalUpdateDecay (Charles & Konecny, "On the Outsized
Importance of Learning Rates in Local Update Methods", paper 002).

LocalUpdate(x, eta, gamma, Theta), round t, cohort S_t:
  client i:  x_1 = x_t;  for k = 1..K(Theta):  g_k = grad f_i(x_k; batch_k)
                                              x_{k+1} = x_k - gamma g_k
             sends q_i = sum_k theta_k g_k          (raw minibatch gradients)
  server:    q_t = mean_i q_i;   x_{t+1} = x_t - eta q_t   (or ServerOpt(eta) on q_t)
Presets: Theta_{1:K} = (1,..,1) FedAvg/Reptile (q_i = (x_t - x_{K+1})/gamma, so
eta = gamma gives FedAvg with server lr 1); Theta_K = e_K first-order MAML;
Theta_{2K+1} = e_{2K+1} K-MAML (quadratic case); Theta_1 = (1) minibatch SGD.

LocalUpdateDecay (Alg. 3-4): each sampled client first measures l_i, its loss
at x_t on its whole local dataset; the server averages them (l_t) and feeds a
ReduceLROnPlateau (`local_update.plateau`) per learning rate: after P consecutive
rounds in which the W-round moving average l^_t exceeds min_{j<t} l^_j - Delta
(§9.1, eq. 25), gamma <- alpha gamma and eta <- beta eta, then C rounds of
cooldown (also at the start). Paper defaults: Delta = 1e-4, alpha = 0.1,
beta = 0.9, P = W = C = 100. `--decay_reference_semantics` follows the
authors' code instead (Keras's `best`, which moves only on improvements larger
than Delta; window starting at +inf); the trainer's
`--decay_reference_semantics` also switches the means of l_i and q_i to the
code's example weighting (`LocalUpdateConfig.example_weighted`), which
`--uniform_weighting` turns back off.

Both report the norm ||q_t|| of the averaged client output, the update the
server applies before eta (paper 002, Fig. 3), as `aggregator/update_norm`.

The plateau states live in the client work's server state and the server
optimiser's learning rate is set from them each round through TFF's
`set_hparams`, so everything is checkpointed with the learning process.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.local_update import plateau
from tff_algos.algorithms.local_update.config import LocalUpdateConfig, LocalUpdateDecayConfig
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import local_training
from tff_algos.core import step_transforms
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose

@dataclasses.dataclass(frozen=True)
class PlateauSchedule:
  """Client-work schedule whose gamma and eta follow two plateau states."""
  client: plateau.PlateauConfig
  server: plateau.PlateauConfig
  num_steps: int

  def initial_state(self):
    return collections.OrderedDict(client=plateau.initial_state(self.client),
                                   server=plateau.initial_state(self.server))

  def hparams(self, state):
    return collections.OrderedDict(
        learning_rate=state['client']['lr'],
        num_steps=tf.constant(self.num_steps, tf.int32),
        num_epochs=tf.constant(-1, tf.int32))

  def next_state(self, state, pre_training_loss):
    return collections.OrderedDict(
        client=plateau.update(state['client'], pre_training_loss, self.client),
        server=plateau.update(state['server'], pre_training_loss, self.server))

  @property
  def server_learning_rate_fn(self):
    return lambda state: state['server']['lr']


def theta_weighted_sum(theta: np.ndarray) -> step_transforms.StepTransform:
  """sum_k theta_k g_k of the RAW minibatch gradients (steps past Theta: 0);
  the gradient itself is left unchanged.

  Where every theta_k is 0 or 1 (all the presets), a step adds g_k itself or
  nothing: one model-sized pass per weighted step instead of two (the product
  theta_k g_k), none on the others. The sums are bit-identical to
  s + theta_k g_k for finite gradients (1 g = g; s + (+-0) = s, as s starts at
  +0 and never becomes -0). A non-finite g_k at a weight-0 step no longer
  turns the sum into NaN (0 inf = NaN), but it makes the local model
  non-finite, so the client is dropped either way (`rounds.drop_if_non_finite`
  checks the model delta too).
  """
  theta = np.asarray(theta, np.float32)
  binary = bool(np.all((theta == 0) | (theta == 1)))

  def init(trainable):
    return tuple(tf.zeros_like(v) for v in trainable)

  def update(grads, weights, grad_sum, step):
    del weights
    step_weights = tf.constant(theta, tf.float32)
    index = tf.minimum(step, tf.size(step_weights) - 1)
    theta_k = tf.where(step < tf.size(step_weights), tf.gather(step_weights, index), 0.0)
    if binary:
      return grads, tf.cond(theta_k > 0,
                            lambda: tuple(s + g for s, g in zip(grad_sum, grads)),
                            lambda: tuple(grad_sum))
    return grads, tuple(s + theta_k * g for s, g in zip(grad_sum, grads))
  return step_transforms.StepTransform(init, update)


def gradient_sum(outcome, hparams):
  """q_i: the Theta-weighted sum (the transform's state), shaped like the delta."""
  del hparams
  return tf.nest.pack_sequence_as(outcome.delta, list(outcome.transform_state))


def _loss_at_x_t(model, initial_weights, dataset):
  loss, examples = local_training.mean_loss(model, initial_weights, dataset)
  return loss, tf.cast(examples, tf.float32)


# l_i, each client's loss at x_t on its whole dataset, before training.
PRE_TRAINING_LOSS = client_work_lib.ClientMeasurement('pre_training_loss', _loss_at_x_t)


def plateau_schedule(config: LocalUpdateDecayConfig) -> PlateauSchedule:
  """LocalUpdateDecay's gamma and eta, each under its plateau rule."""
  def rule(lr: float, factor: float) -> plateau.PlateauConfig:
    return plateau.PlateauConfig(
        initial_lr=lr, decay_factor=factor, min_delta=config.decay_min_delta,
        window_size=config.decay_window, patience=config.decay_patience,
        cooldown=config.decay_cooldown, semantics=config.semantics)
  return PlateauSchedule(client=rule(config.client_learning_rate, config.client_lr_decay_factor),
                         server=rule(config.server_learning_rate, config.server_lr_decay_factor),
                         num_steps=len(config.theta_weights()))


def _client_work(model_fn, config: LocalUpdateConfig, client_schedule, measure_loss: bool):
  return client_work_lib.build_client_work(
      model_fn, tff.learning.optimizers.build_sgdm(config.client_learning_rate),
      client_schedule, output_fn=gradient_sum,
      transform=theta_weighted_sum(config.theta_weights()),
      before_training=PRE_TRAINING_LOSS if measure_loss else None,
      client_weighting=(tff.learning.ClientWeighting.NUM_EXAMPLES
                        if config.example_weighted else
                        tff.learning.ClientWeighting.UNIFORM))


def _update_norm(mean_update):
  """||q_t||: the global l2 norm of the aggregated update (at the server)."""
  @tff.tensorflow.computation(mean_update.type_signature.member)
  def norm(update):
    return collections.OrderedDict(update_norm=tf.linalg.global_norm(tf.nest.flatten(update)))
  return tff.federated_map(norm, mean_update)


def _aggregator():
  return tff.aggregators.add_measurements(tff.aggregators.MeanFactory(),
                                          server_measurement_fn=_update_norm)


def build_local_update(model_fn, config: LocalUpdateConfig = LocalUpdateConfig(),
                       name: str = 'local_update') -> FederatedAlgorithm:
  work = _client_work(model_fn, config, config.client_schedule(),
                      config.measure_pre_training_loss)
  return compose(name, model_fn, work, config.server_optimizer_spec().build(), _aggregator())


def build_local_update_decay(model_fn, config: LocalUpdateDecayConfig = LocalUpdateDecayConfig(),
                             name: str = 'local_update_decay') -> FederatedAlgorithm:
  return compose(name, model_fn, _client_work(model_fn, config, plateau_schedule(config), True),
                 config.server_optimizer_spec().build(), _aggregator())
