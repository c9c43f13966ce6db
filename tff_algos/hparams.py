"""Algorithm-facing hyperparameters, named as the trainer's flags.

Every algorithm builder reads what it needs from one `HParams`; the trainer's
flags fill it (`experiments/flags.py`). Add a field here (with a default) and a
flag of the same name there when an algorithm needs a new knob.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from tff_algos.core import optimizers

if TYPE_CHECKING:  # flag validation imports this module without TensorFlow
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
  client_lr_milestones: Optional[Sequence] = None  # nastya/fedrr: gamma / 10 at these rounds
  server_lr_decay: float = 1.0
  uniform_weighting: bool = False
  # LocalUpdate / LocalUpdateDecay (paper 002).
  theta: str = 'reptile'
  decay_min_delta: float = 1e-4
  client_lr_decay_factor: float = 0.1
  server_lr_decay_factor: float = 0.9
  decay_patience: int = 100
  decay_window: int = 100
  decay_cooldown: int = 100
  decay_reference_semantics: bool = False
  # Nastya (paper 001).
  server_adaptive_lr: bool = False      # Malitsky-Mishchenko adaptive server step
  # Client optimiser statistics (adam, rmsprop; FedGBO, MFL, Mimelite, paper 004).
  client_beta_1: Optional[float] = None
  client_beta_2: Optional[float] = None
  client_epsilon: Optional[float] = None
  # FedGBO/Mime(X)lite: the authors' code (v_0 = 1, no bias correction, eps 1e-3, plain mean).
  gbo_reference_conventions: bool = False
  # FedDyn / SCAFFOLD / FedProx (paper 003).
  feddyn_alpha: float = 0.01
  feddyn_adaptive_alpha: bool = False   # alpha_k = alpha / (n_k / mean n) (reference code)
  feddyn_weight_decay_form: bool = False  # alpha term as SGD weight decay (reference code)
  # SCAFFOLD as paper 003's code: c / w_i, dc weighted by w_i = n_i / mean n, c_i+ over gamma_0.
  scaffold_reference_conventions: bool = False
  # Evaluate the average of all device models (paper 003; feddyn, scaffold, fedavg, fedprox).
  report_device_average: bool = False
  # Local steps (feddyn, scaffold, fedavg, fedprox, fedmax): grad clipped, then + decay.
  client_weight_decay: float = 0.0      # l2 weight decay
  clip_norm: Optional[float] = None     # global-norm gradient clipping
  prox_mu: float = 0.01                 # FedProx proximal strength mu
  # FedMAX (paper 004 baseline).
  fedmax_beta: float = 1.0              # weight of KL(softmax(penultimate) || uniform)
  fedmax_reference_kl: bool = False     # KL(uniform || softmax(.)) as the authors' code

  def client_optimizer_spec(self) -> optimizers.OptimizerSpec:
    return optimizers.OptimizerSpec(self.client_optimizer, self.client_learning_rate,
                                    momentum=self.client_momentum,
                                    beta_1=self.client_beta_1, beta_2=self.client_beta_2,
                                    epsilon=self.client_epsilon)

  def server_optimizer_spec(self) -> optimizers.OptimizerSpec:
    return optimizers.OptimizerSpec(
        self.server_optimizer, self.server_learning_rate,
        momentum=self.server_momentum, beta_1=self.server_beta_1,
        beta_2=self.server_beta_2, epsilon=self.server_epsilon,
        initial_accumulator=self.server_initial_accumulator)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  name: str
  build: Callable[[Any, HParams], FederatedAlgorithm]
  check: Callable[[HParams], Any]   # validates hparams cheaply (raises ValueError)
  description: str
  # The algorithm's own defaults: names of the flags left unset -> {flag: value}
  # for those where the generic default is not the paper's (or does not run).
  defaults: Optional[Callable[[frozenset[str]], dict[str, Any]]] = None


