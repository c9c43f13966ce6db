"""Nastya: FedAvg with Random Reshuffling passes and a server step size.

Paper 001: Malinovsky, Mishchenko, Richtarik, "Server-Side Stepsizes and
Sampling Without Replacement Provably Help in Federated Optimization" (2022).

Round t (Algorithm 1), cohort S_t of C clients drawn uniformly without
replacement, client step gamma, server step eta:

  client i:  pi = a permutation of its data (Random Reshuffling: fresh each
             round; Shuffle-Once: one per client for the whole run)
             y_0 = x_t;  y_{j+1} = y_j - gamma grad f_{i,pi(j)}(y_j),  j < n_i
             sends  g_i = (x_t - y_{n_i}) / (gamma n_i)
  server:    g_t = 1/C sum_{i in S_t} g_i            (uniform, not by examples)
             x_{t+1} = x_t - eta g_t

n_i is the number of local STEPS (minibatches) of the one pass: with batch
size 1 it is the number of examples (the paper), with batch size B it is
ceil(m_i / B), and g_i is the mean of the pass's minibatch gradients (a
ragged last batch weighs as much as a full one). As gamma -> 0, g_i is the
full local gradient at x_t and full participation is gradient descent with
step eta; theory prefers small gamma and eta ~ 1/L.

Options (the paper's experiments): any server optimiser applied to g_t (Adam,
...: `server_optimizer`; SGD at eta is plain Nastya) and the adaptive server
step of Malitsky & Mishchenko (`adaptive_server_lr`, `core.adaptive_step`).

FedRR is eta = gamma n: with equal n_i that is one-epoch FedAvg with uniform
weights and server step 1. `build_fedrr` builds it exactly for unequal n_i too
(each client's own eta_i = gamma n_i, i.e. the plain delta x_t - y_{n_i}).

Shuffling is the round loop's (`RunConfig.shuffle`: 'rr' Random Reshuffling,
'so' Shuffle-Once); the algorithm only takes one pass over what it is given.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms import adaptive_step
from tff_algos.algorithms import fedopt
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import optimizers
from tff_algos.core import schedules
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.flags import rules as flag_rules
from tff_algos.flags.hparams import HParams


@dataclasses.dataclass(frozen=True)
class NastyaConfig:
  client_learning_rate: float = 0.01    # gamma
  # Applied to g_t; SGD at eta is Nastya (its learning rate is eta, or eta_0
  # of the adaptive step).
  server_optimizer: optimizers.OptimizerSpec = optimizers.OptimizerSpec('sgd', 1.0)
  adaptive_server_lr: bool = False      # Malitsky-Mishchenko eta_t (SGD only)
  client_lr_decay: float = 1.0          # gamma_t = gamma d^t (g_i divides by gamma_t)
  client_lr_milestones: tuple[int, ...] = ()  # or gamma / 10 at each of these rounds
  server_lr_decay: float = 1.0          # eta_t = eta d^t (not with the adaptive step)

  def __post_init__(self):
    if not self.client_learning_rate > 0:
      raise ValueError(f'client learning rate gamma must be > 0, got '
                       f'{self.client_learning_rate}')
    if self.adaptive_server_lr:
      if self.server_optimizer.name != 'sgd' or self.server_optimizer.get('momentum'):
        raise ValueError('the adaptive server step is plain SGD; got server '
                         f'optimizer {self.server_optimizer.name!r}')
      if self.server_lr_decay != 1.0:
        raise ValueError('the adaptive server step sets eta_t itself; drop server_lr_decay')
      if not self.server_optimizer.learning_rate > 0:
        raise ValueError('the adaptive server step needs an initial eta_0 > 0')
    if self.client_lr_milestones and self.client_lr_decay != 1.0:
      raise ValueError('give either a client step decay or milestones, not both')
    self.client_schedule()
    schedules.ExponentialDecay(self.server_optimizer.learning_rate, self.server_lr_decay)

  def shared_build_key(self) -> 'NastyaConfig':
    """This config with the numbers read from the state fixed (gamma, d_gamma;
    eta_0, d_eta when eta decays; a constant eta of the server optimiser, kept
    in TFF's finalizer state): configs with equal keys share one build
    (`registry.BuildCache`). Milestones and the adaptive step keep theirs."""
    if self.client_lr_milestones:
      return self
    decaying = self.server_lr_decay != 1.0
    server = self.server_optimizer
    return dataclasses.replace(
        self, client_learning_rate=1.0, client_lr_decay=1.0,
        server_optimizer=(server if self.adaptive_server_lr
                          else dataclasses.replace(server, learning_rate=1.0)),
        server_lr_decay=0.5 if decaying else 1.0)

  def schedule_values(self):
    return self.client_schedule().state_values()

  def shared_server_learning_rate(self) -> Optional[float]:
    if self.client_lr_milestones or self.adaptive_server_lr or self.server_lr_decay != 1.0:
      return None
    return self.server_optimizer.learning_rate

  def client_lr(self):
    if self.client_lr_milestones:
      return schedules.StepDecay(self.client_learning_rate, tuple(self.client_lr_milestones))
    return schedules.ExponentialDecay(self.client_learning_rate, self.client_lr_decay)

  @classmethod
  def from_hparams(cls, hp: HParams) -> 'NastyaConfig':
    return cls(client_learning_rate=hp.client_learning_rate,
               server_optimizer=hp.server_optimizer_spec(),
               adaptive_server_lr=hp.server_adaptive_lr, client_lr_decay=hp.client_lr_decay,
               client_lr_milestones=flag_rules.milestones(hp),
               server_lr_decay=hp.server_lr_decay)

  def client_schedule(self) -> client_work_lib.ClientSchedule:
    """One pass (epoch) over the local data at gamma_t."""
    return client_work_lib.ClientSchedule(
        learning_rate=self.client_lr(), local_steps=None, epochs=1,
        server_lr=schedules.ExponentialDecay(self.server_optimizer.learning_rate,
                                             self.server_lr_decay))

  def server(self) -> tff.learning.optimizers.Optimizer:
    if self.adaptive_server_lr:
      return adaptive_step.AdaptiveGD(self.server_optimizer.learning_rate)
    return self.server_optimizer.build()


def client_gradient(outcome, hparams):
  """g_i = (x_t - y_{n_i}) / (gamma_t n_i), n_i = local steps of the pass."""
  def scale(delta):
    steps = tf.cast(outcome.num_steps, delta.dtype)
    return delta / (tf.cast(hparams['learning_rate'], delta.dtype) * steps)
  # An empty client gives 0/0: its update is non-finite, so the client work
  # drops it (weight 0) and counts it in `non_finite_clients`.
  return tf.nest.map_structure(scale, outcome.delta)


def _client_work(model_fn, config: NastyaConfig, output_fn) -> client_work_lib.ClientWork:
  return client_work_lib.build_client_work(
      model_fn, optimizers.OptimizerSpec('sgd', config.client_learning_rate).build(),
      config.client_schedule(), client_weighting=tff.learning.ClientWeighting.UNIFORM,
      output_fn=output_fn)


def build_nastya(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: NastyaConfig = NastyaConfig(),
                 name: str = 'nastya') -> FederatedAlgorithm:
  """Nastya: clients send g_i, the server steps on their uniform mean g_t."""
  return fedopt.compose(name, model_fn,
                        _client_work(model_fn, config, client_gradient),
                        config.server())


def build_fedrr(model_fn: Callable[[], tff.learning.models.VariableModel],
                config: NastyaConfig = NastyaConfig(),
                name: str = 'fedrr') -> FederatedAlgorithm:
  """FedRR: x_{t+1} = mean_i y_{n_i}^i (Nastya with eta_i = gamma n_i per client).

  Clients send gamma n_i g_i = x_t - y_{n_i}; the server takes an SGD step of
  1. It reads the config's client step (gamma, its decay or milestones); its
  server step must be left at SGD 1.
  """
  server = config.server_optimizer
  if (config.adaptive_server_lr or config.server_lr_decay != 1.0 or server.name != 'sgd'
      or server.learning_rate != 1.0 or server.get('momentum')):
    raise ValueError('FedRR has no server step of its own (eta_i = gamma n_i); use '
                     'Nastya for a server step size or optimizer')
  return fedopt.compose(name, model_fn,
                        _client_work(model_fn, config, client_work_lib.model_delta),
                        optimizers.OptimizerSpec('sgd', 1.0).build())
