"""FedAvg/FedOpt and FedSGD: a server optimiser, decaying K, gamma, eta.

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
decaying eta_t is set into it from the round number. The distributor, client
work, aggregator and finalizer are composed by `core.composition.compose`;
`client_work` is FedOpt's client work, which FedProx, FedMAX, FedNova and
FedExP reuse with another correction or upload.
"""

from __future__ import annotations

from typing import Callable

import tensorflow_federated as tff

from tff_algos.algorithms.fedopt import device_average
from tff_algos.algorithms.fedopt.config import FedAvgConfig, FedOptConfig, FedSGDConfig
from tff_algos.core import client_work as client_work_lib
from tff_algos.core import hparams
from tff_algos.core import rounds
from tff_algos.core import step_transforms
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose


def client_work(model_fn, config: FedOptConfig, correction=None,
                output_fn: client_work_lib.ClientOutputFn = client_work_lib.model_delta,
                ) -> client_work_lib.ClientWork:
  """FedOpt's client work: ClientOpt under the round schedule, weighted by n_i
  (or 1), the local gradient changed by `correction` (x_t -> correction_fn,
  e.g. FedProx's) and then clipped and decayed as the config says; clients
  upload `output_fn(outcome, hparams)` (the delta x_t - y_K; FedNova's d_i)."""
  return client_work_lib.build_client_work(
      model_fn, config.client_optimizer_spec().build(), config.client_schedule(),
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.uniform_weighting
                        else rounds.TOKENS if config.token_weighting
                        else tff.learning.ClientWeighting.NUM_EXAMPLES),
      output_fn=output_fn,
      correction=step_transforms.regularized(correction, config.client_weight_decay,
                                            config.clip_norm))


def build_fedopt(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedOptConfig = FedOptConfig(),
                 name: str = 'fedavg') -> FederatedAlgorithm:
  """FedOpt: ClientOpt for K_t steps (or E epochs), ServerOpt on the mean delta."""
  work = client_work(model_fn, config)
  return compose(name, model_fn, work, config.server_optimizer_spec().build())


def build_fedavg(model_fn: Callable[[], tff.learning.models.VariableModel],
                 config: FedAvgConfig = FedAvgConfig(),
                 name: str = 'fedavg') -> FederatedAlgorithm:
  """FedAvg as the trainer runs it: FedOpt, or, reporting the average of all
  device models, FedAvg's round with a device model per client
  (`device_average`)."""
  if config.report_device_average:
    return device_average.build_device_average(model_fn, config, name)
  return build_fedopt(model_fn, config, name=name)


def build_fedsgd(model_fn, config: FedSGDConfig = FedSGDConfig(),
                 name: str = 'fedsgd') -> FederatedAlgorithm:
  """FedSGD: one local step of plain SGD at gamma = 1 (Delta_i = g_i)."""
  fedopt = hparams.convert(config, FedOptConfig, client_learning_rate=1.0, local_steps=1)
  return build_fedopt(model_fn, fedopt, name=name)
