"""MFL: clients run a stateful optimiser from the global state; both are averaged.

Liu et al., "Accelerating Federated Learning via Momentum Gradient Descent"
(2020), generalised in paper 004 (Mills et al., FedGBO, Sec. 2) to any
optimiser whose parameters are averaged alongside the model. Round t:

  client i:  download x_t and the optimiser state s_t
             y_0 = x_t, s^i_0 = s_t;  (y_k, s^i_k) = Opt(y_{k-1}, s^i_{k-1}, g_k)
             upload y_K (as Delta_i = x_t - y_K) and s^i_K
  server:    x_{t+1} = mean_i y_K^i;   s_{t+1} = mean_i s^i_K

Download x + s, upload x + s (Table 1): SGDm/RMSProp 2 model sizes, Adam 3.
The optimiser is FedGBO's (`gbo.optimizers`, the same flags) with moving
statistics, as the authors' MFL optimisers: s <- T(g, s), then y <- y - M:
SGDm m <- beta m + (1-beta) g, y <- y - gamma m (dampened); RMSProp and Adam
with beta_2 = 0.99, eps = 1e-3 by default, bias-corrected from 0 (or the
authors' v_0 = 1 uncorrected: `reference_conventions`). `tff_optimizer`
runs a `tff.learning.optimizers` optimiser unchanged instead (sgdm
undampened: m <- beta m + g, so its steady step is 1/(1-beta) times ours at
equal flags; SGDm(gamma, beta) here is TFF's sgdm(gamma (1-beta), beta)).
Only the per-weight statistics are averaged; hyperparameters stay at the
server (gamma_t set each round) and the step counter becomes the mean of the
clients' counters. Means are weighted by n_i (or uniform).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.algorithms.gbo import statistics as global_statistics
from tff_algos.algorithms.mfl.config import MFLConfig
from tff_algos.core import accounting
from tff_algos.core import local_training
from tff_algos.core import optimizers
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose

# Optimiser FLOPs per parameter and step with moving statistics (App. B, Table VI).
_FLOPS_MOVING = {cls.name: cls.flops_moving for cls in
                 (gbo_optimizers.SGDm, gbo_optimizers.RMSProp, gbo_optimizers.Adam)}
# Step counters: tff.learning.optimizers' adam ('step'), gbo_optimizers ('count').
_COUNTERS = ('step', 'count')


def _is_statistic(value) -> bool:
  """Per-weight statistics are structures; hyperparameters are scalars."""
  return isinstance(value, (tuple, list))


def client_optimizer(config: MFLConfig) -> tff.learning.optimizers.Optimizer:
  """The optimiser clients run: paper 004's with moving statistics, or TFF's."""
  if config.tff_optimizer is not None:
    return config.tff_optimizer.build()
  return gbo_optimizers.MovingStatistics(gbo_optimizers.of_config(config),
                                         config.client_learning_rate)


def flops_per_param(config: MFLConfig) -> float:
  if config.tff_optimizer is not None:
    return _FLOPS_MOVING[config.tff_optimizer.name]
  return gbo_optimizers.of_config(config).flops_moving


def build_mfl(model_fn: Callable[[], tff.learning.models.VariableModel],
              config: MFLConfig = MFLConfig(), name: str = 'mfl') -> FederatedAlgorithm:
  optimizer = client_optimizer(config)

  def client_fn(model, hparams, state, initial_weights, dataset):
    state = collections.OrderedDict(  # tuples, like the loop's weights and grads
        (k, tuple(v) if _is_statistic(v) else v) for k, v in state.items())
    opt_hparams = collections.OrderedDict(optimizer.get_hparams(state))
    opt_hparams[tff.learning.optimizers.LEARNING_RATE_KEY] = tf.cast(
        hparams['learning_rate'], tf.float32)
    outcome = local_training.run_local_training(
        model, optimizer, opt_hparams, initial_weights, dataset,
        hparams['num_steps'], hparams['num_epochs'], optimizer_state=state)
    final = outcome.optimizer_state
    upload = collections.OrderedDict(
        (k, tuple(v)) for k, v in final.items() if _is_statistic(v))
    for key in _COUNTERS:
      if key in final:
        upload[key] = tf.cast(final[key], tf.float32)
    return outcome, upload

  def server_fn(state, hparams, mean_delta, mean_upload):
    del hparams, mean_delta
    new = collections.OrderedDict(state)
    for key, value in mean_upload.items():
      if key in _COUNTERS:
        new[key] = tf.cast(tf.round(value), state[key].dtype)
      else:
        new[key] = tf.nest.pack_sequence_as(state[key], tf.nest.flatten(value))
    return new

  work = global_statistics.build_statistics_client_work(
      model_fn, config.client_schedule(), optimizer.initialize, client_fn, server_fn,
      server_uses_delta=False,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.plain_mean
                        else tff.learning.ClientWeighting.NUM_EXAMPLES))
  algorithm = compose(name, model_fn, work, optimizers.OptimizerSpec('sgd', 1.0).build())
  return dataclasses.replace(algorithm, compute=accounting.ComputeModel(
      optimizer_flops_per_param=flops_per_param(config)))
