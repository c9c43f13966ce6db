"""Algorithm name -> builder of a `FederatedAlgorithm`.

A builder takes a task's `model_fn` and an `HParams` (the trainer's flag values
under their flag names; see `experiments/flags.py`), and maps them onto the
algorithm's own config dataclass. That mapping lives here, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from tff_algos import fedopt
from tff_algos.core import optimizers
from tff_algos.core.algorithm import FederatedAlgorithm


@dataclasses.dataclass(frozen=True)
class HParams:
  """Algorithm-facing hyperparameters (flag names of the trainer)."""
  client_optimizer: str = 'sgd'
  client_learning_rate: float = 0.1
  client_momentum: Optional[float] = None
  server_optimizer: str = 'sgd'
  server_learning_rate: float = 1.0
  server_momentum: Optional[float] = None
  server_beta_1: Optional[float] = None
  server_beta_2: Optional[float] = None
  server_epsilon: Optional[float] = None
  server_initial_accumulator: Optional[float] = None
  client_epochs_per_round: int = 1
  local_steps: Optional[int] = None
  local_steps_decay: float = 1.0
  client_lr_decay: float = 1.0
  server_lr_decay: float = 1.0
  uniform_weighting: bool = False

  def client_optimizer_spec(self) -> optimizers.OptimizerSpec:
    return optimizers.OptimizerSpec(self.client_optimizer, self.client_learning_rate,
                                    momentum=self.client_momentum)

  def server_optimizer_spec(self) -> optimizers.OptimizerSpec:
    return optimizers.OptimizerSpec(
        self.server_optimizer, self.server_learning_rate,
        momentum=self.server_momentum, beta_1=self.server_beta_1,
        beta_2=self.server_beta_2, epsilon=self.server_epsilon,
        initial_accumulator=self.server_initial_accumulator)


def _fedopt_config(hp: HParams) -> fedopt.FedOptConfig:
  return fedopt.FedOptConfig(
      client_optimizer=hp.client_optimizer_spec(),
      server_optimizer=hp.server_optimizer_spec(),
      local_steps=hp.local_steps, epochs=hp.client_epochs_per_round,
      local_steps_decay=hp.local_steps_decay, client_lr_decay=hp.client_lr_decay,
      server_lr_decay=hp.server_lr_decay, uniform_weighting=hp.uniform_weighting)


def _build_fedavg(model_fn, hp: HParams) -> FederatedAlgorithm:
  return fedopt.build_fedopt(model_fn, _fedopt_config(hp), name='fedavg')


def _build_fedsgd(model_fn, hp: HParams) -> FederatedAlgorithm:
  return fedopt.build_fedsgd(model_fn, hp.server_optimizer_spec(), hp.server_lr_decay)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  name: str
  build: Callable[[Any, HParams], FederatedAlgorithm]
  check: Callable[[HParams], Any]   # validates hparams cheaply (raises ValueError)
  description: str


ALGORITHMS: dict[str, AlgorithmSpec] = {
    'fedavg': AlgorithmSpec('fedavg', _build_fedavg, _fedopt_config,
                            'FedAvg/FedOpt: K steps or E epochs, any server optimizer'),
    'fedsgd': AlgorithmSpec('fedsgd', _build_fedsgd,
                            lambda hp: hp.server_optimizer_spec(),
                            'FedSGD: one gradient per client, server optimizer step'),
}


def get(name: str) -> AlgorithmSpec:
  if name not in ALGORITHMS:
    raise ValueError(f'unknown algorithm {name!r}; choose one of '
                     f'{", ".join(sorted(ALGORITHMS))}')
  return ALGORITHMS[name]


def check(name: str, hp: HParams) -> AlgorithmSpec:
  """Raises ValueError for a bad name or hyperparameters, before any tracing."""
  spec = get(name)
  spec.check(hp)
  hp.client_optimizer_spec()
  return spec


def build(name: str, model_fn, hp: HParams) -> FederatedAlgorithm:
  return check(name, hp).build(model_fn, hp)
