"""MFL: clients run a stateful optimiser from the global state; both are averaged.

Liu et al., "Accelerating Federated Learning via Momentum Gradient Descent"
(2020), generalised in paper 004 (Mills et al., FedGBO, Sec. 2) to any
optimiser whose parameters are averaged alongside the model. Round t:

  client i:  download x_t and the optimiser state s_t
             y_0 = x_t, s^i_0 = s_t;  (y_k, s^i_k) = Opt(y_{k-1}, s^i_{k-1}, g_k)
             upload y_K (as Delta_i = x_t - y_K) and s^i_K
  server:    x_{t+1} = mean_i y_K^i;   s_{t+1} = mean_i s^i_K

Download x + s, upload x + s (Table 1): SGDm/RMSProp 2 model sizes, Adam 3.
The optimiser is `tff.learning.optimizers`' own (sgdm: m <- beta m + g,
y <- y - gamma m; adam with its bias correction; rmsprop), unchanged: the
client loop starts it from the downloaded state instead of a fresh one. Only
the per-weight statistics are averaged; hyperparameters stay at the server
(gamma_t set each round) and Adam's step counter becomes the mean of the
clients' counters. Means are weighted by n_i (or uniform).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import fedgbo
from tff_algos import fedopt
from tff_algos.core import accounting
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import gbo_optimizers
from tff_algos.core import global_statistics
from tff_algos.core import local_training
from tff_algos.core import optimizers
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.hparams import AlgorithmSpec, HParams

NAMES = ('sgdm', 'rmsprop', 'adam')
# Optimiser FLOPs per parameter and step with moving statistics (App. B, Table VI).
_FLOPS_MOVING = {cls.name: cls.flops_moving for cls in
                 (gbo_optimizers.SGDm, gbo_optimizers.RMSProp, gbo_optimizers.Adam)}
_STEP = 'step'   # the step counter in tff.learning.optimizers states (adam)


@dataclasses.dataclass(frozen=True)
class MFLConfig:
  client_optimizer: optimizers.OptimizerSpec = optimizers.OptimizerSpec('sgdm', 0.1)
  local_steps: Optional[int] = 10       # K_0; None: `epochs` passes
  epochs: int = 1
  local_steps_decay: float = 1.0
  client_lr_decay: float = 1.0
  uniform_weighting: bool = False

  def __post_init__(self):
    if self.client_optimizer.name not in NAMES:
      raise ValueError(f'MFL averages client optimiser state: --client_optimizer must be '
                       f'one of {NAMES}, got {self.client_optimizer.name!r}')
    if self.client_optimizer.name == 'sgdm' and not self.client_optimizer.get('momentum'):
      raise ValueError('MFL with sgdm needs a momentum > 0 (else there is no state)')
    self.client_schedule()

  def client_schedule(self) -> client_work_lib.ClientSchedule:
    return client_work_lib.client_schedule(
        self.client_optimizer.learning_rate, self.client_lr_decay, self.local_steps,
        self.local_steps_decay, self.epochs)


def _is_statistic(value) -> bool:
  """Per-weight statistics are structures; hyperparameters are scalars."""
  return isinstance(value, (tuple, list))


def build_mfl(model_fn: Callable[[], tff.learning.models.VariableModel],
              config: MFLConfig = MFLConfig(), name: str = 'mfl') -> FederatedAlgorithm:
  optimizer = config.client_optimizer.build()

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
    if _STEP in final:
      upload[_STEP] = tf.cast(final[_STEP], tf.float32)
    return outcome, upload

  def server_fn(state, hparams, mean_delta, mean_upload):
    del hparams, mean_delta
    new = collections.OrderedDict(state)
    for key, value in mean_upload.items():
      if key == _STEP:
        new[key] = tf.cast(tf.round(value), state[key].dtype)
      else:
        new[key] = tf.nest.pack_sequence_as(state[key], tf.nest.flatten(value))
    return new

  work = global_statistics.build_statistics_client_work(
      model_fn, config.client_schedule(), optimizer.initialize, client_fn, server_fn,
      server_uses_delta=False,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.uniform_weighting
                        else tff.learning.ClientWeighting.NUM_EXAMPLES))
  algorithm = fedopt.compose(name, model_fn, work, optimizers.OptimizerSpec('sgd', 1.0).build())
  return dataclasses.replace(algorithm, compute=accounting.ComputeModel(
      optimizer_flops_per_param=_FLOPS_MOVING[config.client_optimizer.name]))


# Trainer integration: flag values (HParams) -> config, in one place.
def _mfl_config(hp: HParams) -> MFLConfig:
  fedgbo.check_server_default(hp, 'mfl')
  if hp.gbo_reference_conventions:
    raise ValueError('--gbo_reference_conventions is for fedgbo/mimelite/mimexlite')
  return MFLConfig(client_optimizer=hp.client_optimizer_spec(), local_steps=hp.local_steps,
                   epochs=hp.client_epochs_per_round,
                   local_steps_decay=hp.local_steps_decay,
                   client_lr_decay=hp.client_lr_decay,
                   uniform_weighting=hp.uniform_weighting)


def _build_mfl(model_fn, hp: HParams) -> FederatedAlgorithm:
  return build_mfl(model_fn, _mfl_config(hp))


ALGORITHM_SPECS = (
    AlgorithmSpec('mfl', _build_mfl, _mfl_config,
                  'MFL: client sgdm/rmsprop/adam from the global state; models and '
                  'optimiser states averaged'),
)
