"""Package attributes imported on first use (PEP 562).

A package whose parts need no TensorFlow (an algorithm's config, the round
loop's `RunConfig`) answers the binaries' flag questions before TensorFlow
loads; its other parts, which import TensorFlow, load when one of their
names is first asked for:

    # tff_algos/algorithms/fedexp/__init__.py
    from tff_algos.algorithms.fedexp.config import FedExPConfig
    __getattr__, __dir__ = lazy.attributes(__name__, 'process')

`tff_algos.algorithms.fedexp.build_fedexp` then imports `fedexp.process`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Callable


def attributes(package: str, *modules: str) -> tuple[Callable, Callable]:
  """(`__getattr__`, `__dir__`) for `package`: a name it does not define is
  its submodule of that name, or else the first of `modules` (its submodules,
  imported in order until one has the name) that defines it."""

  def __getattr__(name: str):  # pylint: disable=invalid-name
    if name.startswith('__'):
      raise AttributeError(name)
    if importlib.util.find_spec(f'{package}.{name}') is not None:
      return importlib.import_module(f'{package}.{name}')
    for module in modules:
      found = getattr(importlib.import_module(f'{package}.{module}'), name, _MISSING)
      if found is not _MISSING:
        return found
    raise AttributeError(f'module {package!r} has no attribute {name!r}')

  def __dir__():  # pylint: disable=invalid-name
    names = set(vars(sys.modules[package]))
    for module in modules:
      loaded = sys.modules.get(f'{package}.{module}')
      if loaded is not None:
        names.update(n for n in vars(loaded) if not n.startswith('_'))
    return sorted(names)

  return __getattr__, __dir__


_MISSING = object()
