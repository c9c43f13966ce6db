"""Algorithm name -> `AlgorithmSpec` (builder + cheap validation).

Each algorithm module lists its specs in `ALGORITHM_SPECS`; this module only
gathers them, so adding an algorithm is one file plus one line in `_MODULES`.
"""

from __future__ import annotations

import dataclasses

from tff_algos import fedopt
from tff_algos import feddyn
from tff_algos import fedmax
from tff_algos import fedgbo
from tff_algos import fedprox
from tff_algos import nastya
from tff_algos import scaffold
from tff_algos import local_update
from tff_algos import mfl
from tff_algos import mime
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.hparams import AlgorithmSpec, HParams

_MODULES = (fedopt, local_update, nastya, feddyn, scaffold, fedprox, fedmax,
            fedgbo, mfl, mime)

ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec for module in _MODULES for spec in module.ALGORITHM_SPECS}
ALGORITHMS['fedavg'] = fedprox.with_device_average_option(ALGORITHMS['fedavg'])


def get(name: str) -> AlgorithmSpec:
  if name not in ALGORITHMS:
    raise ValueError(f'unknown algorithm {name!r}; choose one of '
                     f'{", ".join(sorted(ALGORITHMS))}')
  return ALGORITHMS[name]


# Flags that only some algorithms read: setting one for another algorithm is
# an error, not a silent no-op. (LocalUpdate's theta/decay_* flags are checked
# by local_update itself.)
ALGORITHM_SPECIFIC_FLAGS: dict[str, frozenset[str]] = {
    **dict.fromkeys(('feddyn_alpha', 'feddyn_adaptive_alpha', 'feddyn_weight_decay_form'),
                    frozenset({'feddyn'})),
    'report_device_average': frozenset({'feddyn', 'scaffold', 'fedavg', 'fedprox'}),
    **dict.fromkeys(('client_weight_decay', 'clip_norm'),
                    frozenset({'feddyn', 'scaffold', 'fedavg', 'fedprox', 'fedmax'})),
    'prox_mu': frozenset({'fedprox'}),
    'scaffold_reference_conventions': frozenset({'scaffold'}),
    **dict.fromkeys(('fedmax_beta', 'fedmax_reference_kl'), frozenset({'fedmax'})),
    'gbo_reference_conventions': frozenset({'fedgbo', 'mfl', 'mimelite', 'mimexlite'}),
    'server_adaptive_lr': frozenset({'nastya'}),
    'client_lr_milestones': frozenset({'nastya', 'fedrr'}),
}


def _set_flags(hp: HParams) -> list[tuple[str, frozenset[str]]]:
  """(flag, its users) for each algorithm-specific flag that `hp` sets."""
  defaults = HParams()
  return [(flag, users) for flag, users in ALGORITHM_SPECIFIC_FLAGS.items()
          if getattr(hp, flag) != getattr(defaults, flag)]


def check_specific_flags(name: str, hp: HParams) -> None:
  for flag, users in _set_flags(hp):
    if name not in users:
      raise ValueError(f'--{flag} is not used by {name} (only by '
                       f'{", ".join(sorted(users))}); leave it at its default')


def ignored_flags(names, hp: HParams) -> dict[str, list[str]]:
  """Algorithm-specific flags set in `hp` -> the algorithms of `names` that do not
  use them (a grid runs those without; its binary says so)."""
  ignoring = {flag: [n for n in names if n not in users] for flag, users in _set_flags(hp)}
  return {flag: ignored for flag, ignored in ignoring.items() if ignored}


def for_algorithm(name: str, hp: HParams) -> HParams:
  """`hp` with other algorithms' specific flags at their defaults (for grids
  that pass one set of flags to several algorithms)."""
  defaults = HParams()
  reset = {flag: getattr(defaults, flag) for flag, users in ALGORITHM_SPECIFIC_FLAGS.items()
           if name not in users}
  return dataclasses.replace(hp, **reset)


def with_defaults(name: str, hp: HParams, unset) -> HParams:
  """`hp` with `name`'s own defaults for the flags in `unset` (those left unset)."""
  spec = ALGORITHMS.get(name)
  if spec is None or spec.defaults is None:
    return hp
  return dataclasses.replace(hp, **spec.defaults(frozenset(unset)))


def check(name: str, hp: HParams) -> AlgorithmSpec:
  """Raises ValueError for a bad name or hyperparameters, before any tracing."""
  spec = get(name)
  check_specific_flags(name, hp)
  spec.check(hp)
  hp.client_optimizer_spec()
  return spec


def build(name: str, model_fn, hp: HParams) -> FederatedAlgorithm:
  return check(name, hp).build(model_fn, hp)
