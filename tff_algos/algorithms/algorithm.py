"""What an algorithm's package says of each algorithm it holds (`Algorithm`):
its name, config class, builder and one-line description. The registry
collects them."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Algorithm:
  name: str
  config: type               # its config class (declared hyperparameters; no TensorFlow)
  builder: str               # its builder in the package, `builder(model_fn, config, name)`
  description: str
  # Config fields this algorithm fixes, where several algorithms share a config
  # class (a Theta preset, Mime's gradient); their flags are not its own.
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def module(self) -> str:
    """The algorithm's package."""
    return self.config.__module__.rpartition('.')[0]

  def default_config(self, **changes):
    """The Python API's config of this algorithm: its defaults (and `changes`)."""
    return self.config(**{**self.fixed, **changes})

  def builder_fn(self):
    """Its builder (imports the package's TensorFlow half)."""
    return getattr(importlib.import_module(self.module), self.builder)
