"""Every reproducible published experiment, by name (see `base.Experiment`).

One module per paper lists its experiments in `EXPERIMENTS`; this module only
gathers them and checks that names are unique.
"""

from __future__ import annotations

import importlib

from experiments.configs.base import Binary, Experiment, Published, Run, TrainerRuns

PAPER_MODULES = ('paper000', 'paper001', 'paper002', 'paper003', 'paper004', 'reddi2020')

__all__ = ['Binary', 'Experiment', 'Published', 'Run', 'TrainerRuns', 'all_experiments',
           'get']


def all_experiments() -> dict[str, Experiment]:
  experiments: dict[str, Experiment] = {}
  for module_name in PAPER_MODULES:
    module = importlib.import_module(f'experiments.configs.{module_name}')
    for exp in module.EXPERIMENTS:
      if exp.name in experiments:
        raise ValueError(f'experiment {exp.name!r} is defined twice')
      experiments[exp.name] = exp
  return experiments


def get(name: str) -> Experiment:
  experiments = all_experiments()
  if name not in experiments:
    close = [n for n in experiments if name.split('_')[0] in n][:10]
    hint = f'; similar: {", ".join(close)}' if close else ''
    raise ValueError(f'unknown experiment {name!r} (python -m experiments.reproduce '
                     f'--list shows all){hint}')
  return experiments[name]
