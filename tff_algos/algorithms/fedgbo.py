"""FedGBO: Federated Global Biased Optimiser (paper 004, Algorithm 1).

Mills et al., "Accelerating Federated Learning with a Global Biased Optimiser".
Round t, cohort S_t, an optimiser with statistics s (SGDm m; RMSProp v;
Adam m, v) written as update U, tracking T, inverse I (`core.gbo_optimizers`):

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
unweighted mean): `FedGBOConfig.reference()`, the trainer's
--gbo_reference_conventions. Unset trainer flags take Sec. 5's K = 10 and
SGDm (beta 0.9): `flag_rules.paper_defaults`.
K_t and eta_t may decay by round (`core.schedules`); the inverse step uses
the round's own K_t and eta_t. K must be a number of steps (not epochs), or
the inverse step would not know it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms import fedopt
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.algorithms.gbo import statistics as global_statistics
from tff_algos.core import accounting
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import local_training
from tff_algos.core import optimizers
from tff_algos.core import schedules
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.flags import rules as flag_rules
from tff_algos.flags.hparams import HParams


@dataclasses.dataclass(frozen=True)
class FedGBOConfig:
  optimizer: gbo_optimizers.GBOOptimizer = gbo_optimizers.SGDm(0.9)
  learning_rate: float = 0.1            # eta (the client step size)
  local_steps: int = 10                 # K_0
  local_steps_decay: float = 1.0        # d_K
  client_lr_decay: float = 1.0          # d_eta
  uniform_weighting: bool = False       # Algorithm 1's plain mean (reference code)

  def __post_init__(self):
    if not isinstance(self.optimizer, gbo_optimizers.GBOOptimizer):
      raise ValueError(f'optimizer must be a GBOOptimizer, got {self.optimizer!r}')
    if not self.learning_rate > 0:
      raise ValueError(f'FedGBO needs a learning rate eta > 0 (its inverse step '
                       f'divides by it), got {self.learning_rate}')
    self.client_schedule()

  @classmethod
  def from_hparams(cls, hp: HParams) -> 'FedGBOConfig':
    return cls(optimizer=gbo_optimizer(hp, 'fedgbo'), learning_rate=hp.client_learning_rate,
               local_steps=hp.local_steps, local_steps_decay=hp.local_steps_decay,
               client_lr_decay=hp.client_lr_decay,
               uniform_weighting=hp.uniform_weighting or hp.gbo_reference_conventions)

  def client_schedule(self) -> client_work_lib.ClientSchedule:
    if self.local_steps is None:
      raise ValueError('FedGBO needs a number of local steps K (--local_steps): '
                       'its inverse step divides by K')
    return client_work_lib.ClientSchedule(
        learning_rate=schedules.ExponentialDecay(self.learning_rate, self.client_lr_decay),
        local_steps=schedules.LocalSteps(self.local_steps, self.local_steps_decay))

  def shared_build_key(self) -> 'FedGBOConfig':
    """This config with eta, d_eta, K_0, d_K (read from the schedule's state)
    fixed: configs with equal keys share one build (`registry.BuildCache`)."""
    return dataclasses.replace(self, learning_rate=1.0, client_lr_decay=1.0, local_steps=1,
                               local_steps_decay=1.0)

  def schedule_values(self):
    return self.client_schedule().state_values()

  @classmethod
  def reference(cls, name: str, **kwargs) -> 'FedGBOConfig':
    """The authors' code: v_0 = 1, no bias correction, eps 1e-3, unweighted mean."""
    beta_1 = kwargs.pop('beta_1', None)
    beta_2 = kwargs.pop('beta_2', None)
    return cls(optimizer=gbo_optimizers.build(name, beta_1=beta_1, beta_2=beta_2,
                                              reference_conventions=True),
               uniform_weighting=True, **kwargs)


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
  rule = config.optimizer

  def server_fn(statistics, hparams, mean_delta, mean_extra):
    """I then T: x_t - x_{t+1} = mean Delta (the finalizer applies it at rate 1)."""
    del mean_extra
    ghat = rule.inverse(mean_delta, statistics, tf.cast(hparams['learning_rate'], tf.float32),
                        hparams['num_steps'])
    return rule.track(statistics, ghat)

  work = global_statistics.build_statistics_client_work(
      model_fn, config.client_schedule(), rule.initialize,
      fixed_statistics_training(rule), server_fn, server_uses_delta=True,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.uniform_weighting
                        else tff.learning.ClientWeighting.NUM_EXAMPLES))
  algorithm = fedopt.compose(name, model_fn, work,
                             optimizers.OptimizerSpec('sgd', 1.0).build())
  return dataclasses.replace(algorithm, compute=accounting.ComputeModel(
      optimizer_flops_per_param=rule.flops_fixed))


# Trainer integration (the flag rules: `flag_rules.fedgbo`).
def gbo_optimizer(hp: HParams, what: str) -> gbo_optimizers.GBOOptimizer:
  """--client_optimizer=sgdm|rmsprop|adam with fixed global statistics."""
  flag_rules.statistics_optimizer(hp, what)
  beta_1 = hp.client_momentum if hp.client_optimizer == 'sgdm' else hp.client_beta_1
  return gbo_optimizers.build(hp.client_optimizer, beta_1=beta_1, beta_2=hp.client_beta_2,
                              epsilon=hp.client_epsilon,
                              reference_conventions=hp.gbo_reference_conventions)
