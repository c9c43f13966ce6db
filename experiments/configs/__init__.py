"""Every reproducible published experiment, by name (see `base.Experiment`).

One module per paper lists its experiments in `EXPERIMENTS`; this module only
gathers them and checks that names are unique. It also holds `number_list`,
the parsing of the paper binaries' comma-separated number flags (the
experiment configs set those flags; this is the one light module those
binaries share).
"""

from __future__ import annotations

import difflib
import importlib
import math
from typing import Sequence

from experiments.configs.base import Binary, Experiment, Published, Run, TrainerRuns
from tff_algos.errors import UserError

PAPER_MODULES = ('paper000', 'paper001', 'paper002', 'paper003', 'paper003_figures', 'paper004',
                 'reddi2020')

__all__ = ['Binary', 'Experiment', 'ListFlagError', 'Published', 'Run', 'TrainerRuns',
           'all_experiments', 'get', 'number_list', 'similar_names']


def all_experiments() -> dict[str, Experiment]:
  experiments: dict[str, Experiment] = {}
  for module_name in PAPER_MODULES:
    module = importlib.import_module(f'experiments.configs.{module_name}')
    for exp in module.EXPERIMENTS:
      if exp.name in experiments:
        raise ValueError(f'experiment {exp.name!r} is defined twice')
      experiments[exp.name] = exp
  return experiments


def similar_names(name: str, names: Sequence[str], limit: int = 5) -> list[str]:
  """The names closest to a misspelt `name`, best first: whole-name similarity
  (a typo anywhere, e.g. at the end of 'fedopt_baselines_emnist_cr_fedavgg'),
  else the names sharing its first '_'-separated word (its paper or family)."""
  close = difflib.get_close_matches(name, names, n=limit, cutoff=0.6)
  first = name.split('_')[0]
  return close or ([n for n in names if first in n][:limit] if first else [])


def get(name: str) -> Experiment:
  experiments = all_experiments()
  if name not in experiments:
    close = similar_names(name, list(experiments))
    hint = f'; similar: {", ".join(close)}' if close else ''
    raise ValueError(f'unknown experiment {name!r} (python -m experiments.reproduce '
                     f'--list shows all){hint}')
  return experiments[name]


# ------------------------------------------------------ list flags of the binaries


class ListFlagError(UserError, ValueError):
  """A bad item of a comma-separated list flag. A `UserError` (one `error:`
  line, exit status 2) and a ValueError, which the binaries' checks catch."""


# Bounds a list's numbers may have: (predicate, words for the message).
_BOUNDS = {
    None: (lambda v: True, ''),
    '> 0': (lambda v: v > 0, ' > 0'),
    '>= 0': (lambda v: v >= 0, ' >= 0'),
    'in (0, 1]': (lambda v: 0 < v <= 1, ' in (0, 1]'),
}


def number_list(flag: str, items: Sequence[str], *, example: str, integer: bool = False,
                bound: str | None = None, nonempty: bool = True) -> list:
  """The items of the list flag `--flag` as finite floats (or ints), each
  within `bound` (a key of `_BOUNDS`).

  A bad item raises `ListFlagError` naming the flag, the item and what the
  list takes (e.g. "--etas: '0' is not > 0 (a comma-separated list of numbers
  > 0, e.g. 0.01,0.1)"): Python's own "could not convert string to float"
  names neither, and a 0 or a nan found only when the results are written
  costs the whole run.
  """
  check, words = _BOUNDS[bound]
  expected = (f'a comma-separated list of {"integers" if integer else "numbers"}{words}, '
              f'e.g. {example}')
  if nonempty and not items:
    raise ListFlagError(f'--{flag} is empty; give {expected}')
  values = []
  for item in items:
    try:
      value = int(item) if integer else float(item)
    except ValueError:
      raise ListFlagError(f'--{flag}: {item!r} is not {"an integer" if integer else "a number"} '
                          f'({expected})') from None
    if not math.isfinite(value):
      raise ListFlagError(f'--{flag}: {item!r} is not a finite number ({expected})')
    if not check(value):
      raise ListFlagError(f'--{flag}: {item!r} is not{words} ({expected})')
    values.append(value)
  return values
