"""Algorithm name -> `AlgorithmSpec` (builder + cheap validation).

Each algorithm module lists its specs in `ALGORITHM_SPECS`; this module only
gathers them, so adding an algorithm is one file plus one line in `_MODULES`.
"""

from __future__ import annotations

from tff_algos import fedopt
from tff_algos import nastya
from tff_algos import local_update
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.hparams import AlgorithmSpec, HParams

_MODULES = (fedopt, local_update, nastya)

ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec for module in _MODULES for spec in module.ALGORITHM_SPECS}


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
