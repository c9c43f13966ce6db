"""The algorithms by name.

Each algorithm package under `tff_algos.algorithms` says what algorithms it
holds (`ALGORITHMS`, `algorithm.Algorithm`): its config class, which declares
the hyperparameters and imports no TensorFlow (the binaries answer flag
questions from it), and its builder `build_<name>(model_fn, config, name)`,
imported with the first build. Adding an algorithm: its package, its test,
and its package's name in `PACKAGES`.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import importlib
from typing import TYPE_CHECKING

from tff_algos.algorithms.algorithm import Algorithm

if TYPE_CHECKING:
  from tff_algos.core.algorithm import FederatedAlgorithm


# The algorithm packages, each declaring its algorithms (`ALGORITHMS` in its
# __init__.py); registry order is this order.
PACKAGES = ('fedopt', 'local_update', 'nastya', 'feddyn', 'scaffold', 'fedprox', 'fednova',
            'fedexp', 'fedsplit', 'fedmax', 'fedgbo', 'mfl', 'mime')

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a for package in PACKAGES
    for a in importlib.import_module(f'tff_algos.algorithms.{package}').ALGORITHMS}


def unknown(names, flag: str = '') -> str:
  """'' when every name is registered, else the one line that says which are
  not (`flag`, e.g. '--algorithms', first), the closest registered names and
  all of them: every binary that takes algorithm names says it this way."""
  bad = [n for n in names if n not in ALGORITHMS]
  if not bad:
    return ''
  close = [c for n in bad for c in difflib.get_close_matches(n, list(ALGORITHMS), n=1)]
  hint = f' (did you mean {" or ".join(dict.fromkeys(close))}?)' if close else ''
  return (f'{flag + ": " if flag else ""}unknown algorithm'
          f'{"s" if len(bad) > 1 else ""} {", ".join(map(repr, bad))}{hint}; '
          f'choose from {", ".join(sorted(ALGORITHMS))}')


def get(name: str) -> Algorithm:
  if name not in ALGORITHMS:
    raise ValueError(unknown([name]))
  return ALGORITHMS[name]


def config_classes() -> list[type]:
  """Every registered config class, once each, in registry order."""
  return list(dict.fromkeys(a.config for a in ALGORITHMS.values()))


def build(name: str, model_fn, config=None) -> FederatedAlgorithm:
  """`name`'s learning process on `model_fn`: its builder called with `config`
  (None: the algorithm's defaults). Imports TensorFlow."""
  algorithm = get(name)
  return algorithm.builder_fn()(model_fn, algorithm.default_config() if config is None
                                else config, name)


class BuildCache:
  """`build`, with each algorithm built (and, on its first round, traced) once
  per process for the runs of a grid, a reproduction's seeds or a sweep.

  Runs whose configs are equal share one build (seeds are not part of a
  config). So do runs of an algorithm whose config has `shared_build_key()`
  when their keys are equal: those differ only in numbers its computations
  read from the state (the client schedule's gamma_0, d_gamma, K_0, d_K, and
  the server optimiser's eta where TFF's finalizer keeps it), which the
  trainer sets from `config.schedule_values()` (and
  `config.shared_server_learning_rate()`) into the initial state. Keys
  include `model_fn` itself: reuse one task object per task. `made` counts
  the builds made (a caller compares it to tell a reused build).
  """

  MAX_BUILDS = 32  # the least recently used build is dropped beyond this

  def __init__(self):
    self._built: collections.OrderedDict = collections.OrderedDict()
    self.made = 0

  def __len__(self) -> int:
    return len(self._built)

  def clear(self) -> None:
    """Drops every kept build (`made` keeps counting)."""
    self._built.clear()

  def build(self, name: str, model_fn, config) -> FederatedAlgorithm:
    """`registry.build(name, model_fn, config)`, built once per key."""
    return self.build_config(get(name).builder_fn(), model_fn, config, name)

  def build_config(self, builder, model_fn, cfg, name: str) -> FederatedAlgorithm:
    """`builder(model_fn, cfg, name)` (an algorithm's `build_<name>`), built
    once per key."""
    shared = getattr(cfg, 'shared_build_key', None)
    from tff_algos.core import local_training  # pylint: disable=g-import-not-at-top
    # Whether client loops are compiled (`local_training.compiled_loops`) is
    # part of what is built.
    key = (name, builder, model_fn, shared() if shared is not None else cfg,
           local_training.compiling())
    try:
      hash(key)
    except TypeError:  # a config holding a list or `Lanes`: built each time
      self.made += 1
      return builder(model_fn, cfg, name)
    if key not in self._built:
      if len(self._built) >= self.MAX_BUILDS:
        self._built.popitem(last=False)
      self._built[key] = builder(model_fn, cfg, name)
      self.made += 1
      return self._built[key]
    self._built.move_to_end(key)
    algorithm = self._built[key]
    if shared is not None:
      algorithm = dataclasses.replace(
          algorithm, schedule_values=cfg.schedule_values(),
          server_learning_rate=getattr(cfg, 'shared_server_learning_rate', lambda: None)())
    return algorithm
