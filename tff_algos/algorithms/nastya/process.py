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
step of Malitsky & Mishchenko (`server_adaptive_lr`, `nastya.adaptive_step`).

FedRR is eta = gamma n: with equal n_i that is one-epoch FedAvg with uniform
weights and server step 1. `build_fedrr` builds it exactly for unequal n_i too
(each client's own eta_i = gamma n_i, i.e. the plain delta x_t - y_{n_i}).

Shuffling is the round loop's (`RunConfig.shuffle`: 'rr' Random Reshuffling,
'so' Shuffle-Once); the algorithm only takes one pass over what it is given.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.nastya import adaptive_step
from tff_algos.algorithms.nastya.config import FedRRConfig, NastyaConfig
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import optimizers
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose


def client_gradient(outcome, hparams):
  """g_i = (x_t - y_{n_i}) / (gamma_t n_i), n_i = local steps of the pass."""
  def scale(delta):
    steps = tf.cast(outcome.num_steps, delta.dtype)
    return delta / (tf.cast(hparams['learning_rate'], delta.dtype) * steps)
  # An empty client gives 0/0: its update is non-finite, so the client work
  # drops it (weight 0) and counts it in `non_finite_clients`.
  return tf.nest.map_structure(scale, outcome.delta)


def server_optimizer(config: NastyaConfig) -> tff.learning.optimizers.Optimizer:
  """The server's step on g_t: the adaptive step, or the server optimiser at eta."""
  if config.server_adaptive_lr:
    return adaptive_step.AdaptiveGD(config.server_learning_rate)
  return config.server_optimizer_spec().build()


def _client_work(model_fn, config: FedRRConfig, output_fn) -> client_work_lib.ClientWork:
  return client_work_lib.build_client_work(
      model_fn, optimizers.OptimizerSpec('sgd', config.client_learning_rate).build(),
      config.client_schedule(), client_weighting=tff.learning.ClientWeighting.UNIFORM,
      output_fn=output_fn)


def build_nastya(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: NastyaConfig = NastyaConfig(),
                 name: str = 'nastya') -> FederatedAlgorithm:
  """Nastya: clients send g_i, the server steps on their uniform mean g_t."""
  return compose(name, model_fn, _client_work(model_fn, config, client_gradient),
                 server_optimizer(config))


def build_fedrr(model_fn: Callable[[], tff.learning.models.VariableModel],
                config: FedRRConfig = FedRRConfig(),
                name: str = 'fedrr') -> FederatedAlgorithm:
  """FedRR: x_{t+1} = mean_i y_{n_i}^i (Nastya with eta_i = gamma n_i per client).

  Clients send gamma n_i g_i = x_t - y_{n_i}; the server takes an SGD step of 1.
  """
  return compose(name, model_fn, _client_work(model_fn, config, client_work_lib.model_delta),
                 optimizers.OptimizerSpec('sgd', 1.0).build())
