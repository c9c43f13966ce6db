"""FedGBO: Federated Global Biased Optimiser (paper 004, Algorithm 1).

Mills et al., "Accelerating Federated Learning with a Global Biased Optimiser".
Round t, cohort S_t, an optimiser with statistics s (SGDm m; RMSProp v;
Adam m, v) written as update U, tracking T, inverse I (`gbo.optimizers`):

  client i:  download x_t and s_t;  y_0 = x_t
             for k = 1..K:  y_k = y_{k-1} - U(eta, g_k, s_t)     (s_t FIXED)
             upload y_K only (here as Delta_i = x_t - y_K: the same size)
  server:    x_{t+1} = mean_i y_K^i
             g~_t = I(x_t, x_{t+1}, s_t, K, eta)     the average local gradient
             s_{t+1} = T(g~_t, s_t)

Download x + s, upload x (Table 1). With SGDm and beta = 0 it is FedAvg.
Library defaults where Algorithm 1 and Table II are silent or differ: the
client mean is weighted by n_i (Algorithm 1 writes the plain mean 1/|S_t|:
`uniform_weighting`); s_0 = 0 with Adam's bias correction (v-hat = 1 before
the first tracking step); eps = 1e-3, beta_2 = 0.99 (Sec. 5).
`gbo_optimizers.build(..., reference_conventions=True)` plus uniform
weighting are the authors' code (v_0 = 1, no bias correction, eps = 1e-3,
unweighted mean): `reference_conventions`, the trainer's
--gbo_reference_conventions. The defaults are Sec. 5's K = 10 and SGDm
(beta 0.9).
K_t and eta_t may decay by round (`core.schedules`); the inverse step uses
the round's own K_t and eta_t. K must be a number of steps (not epochs), or
the inverse step would not know it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fedgbo.config import FedGBOConfig
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.algorithms.gbo import statistics as global_statistics
from tff_algos.core import accounting
from tff_algos.core import local_training
from tff_algos.core import optimizers
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose


def fixed_statistics_training(rule: gbo_optimizers.GBOOptimizer):
  """K local steps y <- y - U(eta, g, s_t) with the downloaded s_t fixed."""
  def client_fn(model, hparams, statistics, initial_weights, dataset):
    optimizer = gbo_optimizers.FixedStatistics(rule, statistics)
    outcome = local_training.run_scheduled(model, optimizer, hparams, initial_weights,
                                           dataset)
    return outcome, ()
  return client_fn


def build_fedgbo(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedGBOConfig = FedGBOConfig(),
                 name: str = 'fedgbo') -> FederatedAlgorithm:
  rule = gbo_optimizers.of_config(config)

  def server_fn(statistics, hparams, mean_delta, mean_extra):
    """I then T: x_t - x_{t+1} = mean Delta (the finalizer applies it at rate 1)."""
    del mean_extra
    ghat = rule.inverse(mean_delta, statistics, tf.cast(hparams['learning_rate'], tf.float32),
                        hparams['num_steps'])
    return rule.track(statistics, ghat)

  work = global_statistics.build_statistics_client_work(
      model_fn, config.client_schedule(), rule.initialize,
      fixed_statistics_training(rule), server_fn, server_uses_delta=True,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.plain_mean
                        else tff.learning.ClientWeighting.NUM_EXAMPLES))
  algorithm = compose(name, model_fn, work, optimizers.OptimizerSpec('sgd', 1.0).build())
  return dataclasses.replace(algorithm, compute=accounting.ComputeModel(
      optimizer_flops_per_param=rule.flops_fixed))
