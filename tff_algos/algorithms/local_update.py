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
ReduceLROnPlateau (`core.plateau`) per learning rate: after P consecutive
rounds in which the W-round moving average l^_t exceeds min_{j<t} l^_j - Delta
(§9.1, eq. 25), gamma <- alpha gamma and eta <- beta eta, then C rounds of
cooldown (also at the start). Paper defaults: Delta = 1e-4, alpha = 0.1,
beta = 0.9, P = W = C = 100. `DecayConfig.semantics='reference'` follows the
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
from typing import Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms import fedopt
from tff_algos.algorithms import plateau
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import local_training
from tff_algos.core import optimizers
from tff_algos.core import schedules
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.flags.hparams import HParams

PRESETS = ('reptile', 'fomaml', 'kmaml', 'minibatch_sgd')


def theta_preset(name: str, k: int) -> np.ndarray:
  """Theta for a named preset with K local steps (K-MAML runs 2K + 1 steps)."""
  if k < 1:
    raise ValueError(f'K must be >= 1, got {k}')
  if name == 'reptile':
    return np.ones(k, np.float32)
  if name == 'fomaml':
    return np.eye(k, dtype=np.float32)[-1]
  if name == 'kmaml':
    return np.eye(2 * k + 1, dtype=np.float32)[-1]
  if name == 'minibatch_sgd':
    return np.ones(1, np.float32)
  raise ValueError(f'unknown Theta preset {name!r}; choose one of {PRESETS}')


def parse_theta(spec: Union[str, Sequence[float]], k: int) -> np.ndarray:
  """A preset name or explicit weights ('1,0,0.5'); trailing zeros dropped."""
  if isinstance(spec, str) and spec in PRESETS:
    theta = theta_preset(spec, k)
  else:
    values = spec.split(',') if isinstance(spec, str) else spec
    try:
      theta = np.asarray([float(v) for v in values], np.float32)
    except ValueError:
      raise ValueError(f'--theta must be one of {PRESETS} or comma-separated '
                       f'numbers, got {spec!r}') from None
  if theta.ndim != 1 or not theta.size or (theta < 0).any() or not (theta > 0).any():
    raise ValueError(f'Theta needs non-negative weights with one > 0, got {spec!r}')
  return theta[:np.flatnonzero(theta)[-1] + 1]


@dataclasses.dataclass(frozen=True)
class LocalUpdateConfig:
  theta: tuple[float, ...]
  client_learning_rate: float = 0.1                 # gamma
  server_optimizer: optimizers.OptimizerSpec = optimizers.OptimizerSpec('sgd', 0.1)
  example_weighted: bool = False                    # q_t, l_t: mean or n_i-weighted
  measure_pre_training_loss: bool = False           # LocalUpdate: report l_t too

  def __post_init__(self):
    parse_theta(list(self.theta), 1)
    if self.client_learning_rate < 0:
      raise ValueError('client learning rate must be >= 0')

  def shared_build_key(self) -> 'LocalUpdateConfig':
    """This config with gamma and eta (read from the state: the schedule's and
    TFF's finalizer's) fixed: configs with equal keys share one build
    (`registry.BuildCache`), e.g. paper 002's gamma x eta grids."""
    return dataclasses.replace(
        self, client_learning_rate=1.0,
        server_optimizer=dataclasses.replace(self.server_optimizer, learning_rate=1.0))

  def schedule(self) -> client_work_lib.ClientSchedule:
    return client_work_lib.ClientSchedule(
        learning_rate=schedules.ExponentialDecay(self.client_learning_rate),
        local_steps=schedules.LocalSteps(len(self.theta)))

  def schedule_values(self):
    return self.schedule().state_values()

  def shared_server_learning_rate(self) -> float:
    return self.server_optimizer.learning_rate

  @classmethod
  def from_hparams(cls, hp: HParams, theta: Optional[str] = None) -> 'LocalUpdateConfig':
    """`theta`: a preset name instead of --theta; K = --local_steps (default 10)."""
    k = hp.local_steps or 10
    return cls(theta=tuple(parse_theta(theta or hp.theta, k).tolist()),
               client_learning_rate=hp.client_learning_rate,
               server_optimizer=hp.server_optimizer_spec(),
               example_weighted=not hp.uniform_weighting and hp.decay_reference_semantics)


@dataclasses.dataclass(frozen=True)
class DecayConfig:
  """LocalUpdateDecay's plateau rule (paper defaults)."""
  min_delta: float = 1e-4          # Delta
  client_decay: float = 0.1        # alpha
  server_decay: float = 0.9        # beta
  patience: int = 100              # P
  window: int = 100                # W
  cooldown: int = 100              # C
  semantics: str = 'paper'         # plateau.SEMANTICS: eq. 25, or the authors' code

  @classmethod
  def from_hparams(cls, hp: HParams) -> 'DecayConfig':
    return cls(min_delta=hp.decay_min_delta, client_decay=hp.client_lr_decay_factor,
               server_decay=hp.server_lr_decay_factor, patience=hp.decay_patience,
               window=hp.decay_window, cooldown=hp.decay_cooldown,
               semantics='reference' if hp.decay_reference_semantics else 'paper')

  def plateau(self, lr: float, factor: float) -> plateau.PlateauConfig:
    return plateau.PlateauConfig(
        initial_lr=lr, decay_factor=factor, min_delta=self.min_delta,
        window_size=self.window, patience=self.patience, cooldown=self.cooldown,
        semantics=self.semantics)


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


def theta_weighted_sum(theta: np.ndarray) -> local_training.StepTransform:
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
  return local_training.StepTransform(init, update)


def gradient_sum(outcome, hparams):
  """q_i: the Theta-weighted sum (the transform's state), shaped like the delta."""
  del hparams
  return tf.nest.pack_sequence_as(outcome.delta, list(outcome.transform_state))


def _loss_at_x_t(model, initial_weights, dataset):
  loss, examples = local_training.mean_loss(model, initial_weights, dataset)
  return loss, tf.cast(examples, tf.float32)


# l_i, each client's loss at x_t on its whole dataset, before training.
PRE_TRAINING_LOSS = client_work_lib.ClientMeasurement('pre_training_loss', _loss_at_x_t)


def _client_work(model_fn, config: LocalUpdateConfig, schedule, measure_loss: bool):
  return client_work_lib.build_client_work(
      model_fn, tff.learning.optimizers.build_sgdm(config.client_learning_rate),
      schedule, output_fn=gradient_sum,
      transform=theta_weighted_sum(np.asarray(config.theta, np.float32)),
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


def build_local_update(model_fn, config: LocalUpdateConfig,
                       name: str = 'local_update') -> FederatedAlgorithm:
  work = _client_work(model_fn, config, config.schedule(), config.measure_pre_training_loss)
  return fedopt.compose(name, model_fn, work,
                        config.server_optimizer.build(), _aggregator())


@dataclasses.dataclass(frozen=True)
class LocalUpdateDecayConfig:
  """LocalUpdateDecay: LocalUpdate's round under the plateau rule `decay`."""
  update: LocalUpdateConfig
  decay: DecayConfig = DecayConfig()

  def __post_init__(self):
    self.plateau_schedule()  # checks the two plateau rules

  @classmethod
  def from_hparams(cls, hp: HParams) -> 'LocalUpdateDecayConfig':
    return cls(LocalUpdateConfig.from_hparams(hp), DecayConfig.from_hparams(hp))

  def plateau_schedule(self) -> PlateauSchedule:
    update, decay = self.update, self.decay
    return PlateauSchedule(
        client=decay.plateau(update.client_learning_rate, decay.client_decay),
        server=decay.plateau(update.server_optimizer.learning_rate, decay.server_decay),
        num_steps=len(update.theta))


def build_local_update_decay(model_fn, config: LocalUpdateDecayConfig,
                             name: str = 'local_update_decay') -> FederatedAlgorithm:
  update = config.update
  return fedopt.compose(name, model_fn,
                        _client_work(model_fn, update, config.plateau_schedule(), True),
                        update.server_optimizer.build(), _aggregator())
