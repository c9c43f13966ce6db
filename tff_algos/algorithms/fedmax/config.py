"""FedMAX's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.algorithms.fedopt.config import FedOptConfig
from tff_algos.core.hparams import at_least, hparam


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedMaxConfig(FedOptConfig):
  """FedOpt's round on the local loss plus beta KL(softmax(penultimate) || U)."""
  beta: float = hparam(1.0, 'FedMAX: weight beta of KL(softmax(penultimate activations) || '
                            "uniform) in the local loss (paper 004's alpha).",
                       flag='fedmax_beta', valid=at_least(0))
  reference_kl: bool = hparam(False, "FedMAX: KL(uniform || softmax(.)), the direction of the "
                                     "authors' code.", flag='fedmax_reference_kl')


ALGORITHMS = (Algorithm(
    'fedmax', FedMaxConfig, 'build_fedmax',
    'FedMAX: FedAvg + beta KL(softmax(penultimate) || uniform)'),)
