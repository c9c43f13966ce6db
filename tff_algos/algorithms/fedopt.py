"""FedOpt: FedAvg / FedSGD with a server optimiser and decaying K, gamma, eta.

Papers: McMahan et al. 2017 (FedAvg); Reddi et al. 2021 (Adaptive Federated
Optimization: FedAdam, FedYogi, FedAdagrad); Mills et al., "Faster Federated
Learning with Decaying Number of Local SGD Steps" (paper 000: K_t, gamma_t, eta_t).

Round t, cohort S_t:
  client i:  y_0 = x_t;  K_t = max(1, ceil(K_0 d_K^t)) steps  y_k = ClientOpt_{gamma_t}(y_{k-1}, g_k)
             sends  Delta_i = x_t - y_K  with weight n_i (examples processed) or 1
  server:    q_t = sum_i w_i Delta_i / sum_i w_i
             x_{t+1} = ServerOpt_{eta_t}(x_t, q_t)      (SGD with eta = 1: FedAvg)
FedSGD is K = 1 with client SGD at gamma = 1, so Delta_i is the minibatch
gradient at x_t and the server step is eta_t * gradient.

Built from TFF's templates: broadcast distributor, our schedule-aware client
work (`core.client_work`), `tff.aggregators.MeanFactory`, and TFF's
`build_apply_optimizer_finalizer` (which rejects non-finite updates, keeping
the server state; `core.finalizer`'s copy, traced without AutoGraph); a
decaying eta_t is set into it from the round number.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow_federated as tff

from tff_algos.core import accounting
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import composition
from tff_algos.core import finalizer
from tff_algos.core import local_training
from tff_algos.core import optimizers
from tff_algos.core import rounds
from tff_algos.core import schedules
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.flags.hparams import HParams


@dataclasses.dataclass(frozen=True)
class FedOptConfig:
  client_optimizer: optimizers.OptimizerSpec = optimizers.OptimizerSpec('sgd', 0.1)
  server_optimizer: optimizers.OptimizerSpec = optimizers.OptimizerSpec('sgd', 1.0)
  local_steps: Optional[int] = None     # K_0; None: run `epochs` epochs
  epochs: int = 1
  local_steps_decay: float = 1.0        # d_K
  client_lr_decay: float = 1.0          # d_gamma
  server_lr_decay: float = 1.0          # d_eta
  uniform_weighting: bool = False       # weight clients by 1 instead of n_i
  token_weighting: bool = False         # ... by their non-padding target tokens
  # Local-step regularisation of paper 003's reference code (its FedAvg and
  # FedProx baselines): the gradient clipped to this global norm, then
  # weight_decay * y added (`local_training.clip_then_decay`).
  weight_decay: float = 0.0
  clip_norm: Optional[float] = None

  def __post_init__(self):
    if self.uniform_weighting and self.token_weighting:
      raise ValueError('--uniform_weighting and --token_weighting exclude each other')
    self.client_schedule()  # validates K_0, E, gamma, eta and their decays
    local_training.check_regularization(self.weight_decay, self.clip_norm)

  @classmethod
  def from_hparams(cls, hp: HParams) -> 'FedOptConfig':
    return cls(client_optimizer=hp.client_optimizer_spec(),
               server_optimizer=hp.server_optimizer_spec(),
               local_steps=hp.local_steps, epochs=hp.client_epochs_per_round,
               local_steps_decay=hp.local_steps_decay, client_lr_decay=hp.client_lr_decay,
               server_lr_decay=hp.server_lr_decay, uniform_weighting=hp.uniform_weighting,
               token_weighting=hp.token_weighting, weight_decay=hp.client_weight_decay, clip_norm=hp.clip_norm)

  def shared_build_key(self, server_in_state: bool = True) -> 'FedOptConfig':
    """This config with the numbers that FedOpt's computations read from the
    state at fixed values: configs with equal keys run on one build
    (`registry.BuildCache`). gamma_0, d_gamma, K_0, d_K are the schedule's
    (`schedule_values`); eta_0 and d_eta too when eta decays, else eta is the
    server optimiser's hparam in TFF's finalizer state
    (`shared_server_learning_rate`; `server_in_state=False`: a constant)."""
    server = self.server_optimizer
    decaying = self.server_lr_decay != 1.0
    return dataclasses.replace(
        self, client_optimizer=dataclasses.replace(self.client_optimizer, learning_rate=1.0),
        client_lr_decay=1.0, local_steps=None if self.local_steps is None else 1,
        local_steps_decay=1.0,
        server_optimizer=(dataclasses.replace(server, learning_rate=1.0)
                          if decaying or server_in_state else server),
        server_lr_decay=0.5 if decaying else 1.0)

  def schedule_values(self):
    return self.client_schedule().state_values()

  def shared_server_learning_rate(self) -> Optional[float]:
    return None if self.server_lr_decay != 1.0 else self.server_optimizer.learning_rate

  def client_schedule(self) -> client_work_lib.ClientSchedule:
    return client_work_lib.client_schedule(
        self.client_optimizer.learning_rate, self.client_lr_decay, self.local_steps,
        self.local_steps_decay, self.epochs,
        server_lr=schedules.ExponentialDecay(self.server_optimizer.learning_rate,
                                             self.server_lr_decay))


def initial_weights_computation(model_fn) -> tff.Computation:
  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())
  return initial_weights


def client_work(model_fn, config: FedOptConfig, correction=None,
                output_fn: client_work_lib.ClientOutputFn = client_work_lib.model_delta,
                ) -> client_work_lib.ClientWork:
  """FedOpt's client work: ClientOpt under the round schedule, weighted by n_i
  (or 1), the local gradient changed by `correction` (x_t -> correction_fn,
  e.g. FedProx's) and then clipped and decayed as the config says; clients
  upload `output_fn(outcome, hparams)` (the delta x_t - y_K; FedNova's d_i)."""
  return client_work_lib.build_client_work(
      model_fn, config.client_optimizer.build(), config.client_schedule(),
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.uniform_weighting
                        else rounds.TOKENS if config.token_weighting
                        else tff.learning.ClientWeighting.NUM_EXAMPLES),
      output_fn=output_fn,
      correction=local_training.regularized(correction, config.weight_decay,
                                            config.clip_norm))


def build_fedopt(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedOptConfig = FedOptConfig(),
                 name: str = 'fedavg') -> FederatedAlgorithm:
  work = client_work(model_fn, config)
  return compose(name, model_fn, work, config.server_optimizer.build())


def compose(name: str, model_fn, work: client_work_lib.ClientWork,
            server_optimizer: tff.learning.optimizers.Optimizer,
            aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
            ) -> FederatedAlgorithm:
  """Distributor + client work + weighted mean + optimiser finalizer.

  If the client work's schedule dictates the server learning rate
  (`work.server_learning_rate_fn`: a decaying eta_t, a plateau rule), it is set
  into the optimiser each round (`core.composition`).
  """
  initial_weights = initial_weights_computation(model_fn)
  weights_type = initial_weights.type_signature.result
  result_type = work.process.next.type_signature.result.result.member
  aggregator = (aggregator or tff.aggregators.MeanFactory()).create(
      result_type.update, result_type.update_weight)
  parts = (initial_weights,
           tff.learning.templates.build_broadcast_process(weights_type),
           work.process, aggregator,
           finalizer.build_apply_optimizer_finalizer(server_optimizer, weights_type))
  if work.server_learning_rate_fn is None:
    process = tff.learning.templates.compose_learning_process(*parts)
  else:
    process = composition.compose_with_server_lr(*parts, work.server_learning_rate_fn)
  return FederatedAlgorithm(
      name=name, process=process,
      traffic=accounting.client_traffic(work.client_computation, weights_type))


@dataclasses.dataclass(frozen=True)
class FedSGDConfig:
  """FedSGD's server step: eta_t = eta d_eta^t of any server optimiser."""
  server_optimizer: optimizers.OptimizerSpec = optimizers.OptimizerSpec('sgd', 0.1)
  server_lr_decay: float = 1.0

  def __post_init__(self):
    schedules.ExponentialDecay(self.server_optimizer.learning_rate, self.server_lr_decay)

  @classmethod
  def from_hparams(cls, hp: HParams) -> 'FedSGDConfig':
    return cls(server_optimizer=hp.server_optimizer_spec(), server_lr_decay=hp.server_lr_decay)


def build_fedsgd(model_fn, config: FedSGDConfig = FedSGDConfig(),
                 name: str = 'fedsgd') -> FederatedAlgorithm:
  """FedSGD: one local step of plain SGD at gamma = 1 (Delta_i = g_i)."""
  fedopt_config = FedOptConfig(client_optimizer=optimizers.OptimizerSpec('sgd', 1.0),
                               server_optimizer=config.server_optimizer, local_steps=1,
                               server_lr_decay=config.server_lr_decay)
  return build_fedopt(model_fn, fedopt_config, name=name)
