"""Optimiser names -> `tff.learning.optimizers`.

`OptimizerSpec` holds what a flag set can say about an optimiser; unspecified
fields take the paper defaults listed in `_DEFAULTS` (FedAdam of paper 000:
beta_1=.9, beta_2=.999, eps=1e-8; Yogi of paper 002: beta_2=.99, eps=1e-5,
initial accumulator 0).

Where epsilon goes: Adam, Yogi and RMSProp (TFF's) divide by sqrt(v) + eps.
'adagrad' does the same, w <- w - lr g / (sqrt(acc) + eps): Keras's Adagrad,
which Reddi et al.'s FedAdagrad ran (their tuned eps values assume it), and
Duchi et al.'s delta. TFF's own Adagrad divides by sqrt(acc + eps) instead;
it is 'adagrad_tff'. The one optimiser written here is `keras_adagrad.KerasAdagrad`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # imported where used: flag validation must not load TensorFlow
  import tensorflow_federated as tff

NAMES = ('sgd', 'sgdm', 'adam', 'yogi', 'adagrad', 'adagrad_tff', 'rmsprop')
# Every optimiser's hyperparameters besides the learning rate (`OptimizerSpec`'s fields).
HYPERPARAMETERS = ('momentum', 'beta_1', 'beta_2', 'epsilon', 'initial_accumulator')

_DEFAULTS = {
    'sgd': {},
    'sgdm': dict(momentum=0.9),
    'adam': dict(beta_1=0.9, beta_2=0.999, epsilon=1e-8),
    'yogi': dict(beta_1=0.9, beta_2=0.99, epsilon=1e-5, initial_accumulator=0.0),
    'adagrad': dict(epsilon=1e-7, initial_accumulator=0.0),
    'adagrad_tff': dict(epsilon=1e-7, initial_accumulator=0.0),
    'rmsprop': dict(beta_2=0.9, epsilon=1e-7),
}


# What each hyperparameter may be: TFF's builders refuse some values only when
# the computation is built (a traceback after TensorFlow loads) and take others
# that make no optimiser: a beta of 1 divides Adam's bias correction by zero.
_RANGES = {
    'learning_rate': (lambda v: v >= 0, '>= 0'),  # inf: the tests' diverging client
    'momentum': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'beta_1': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'beta_2': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'epsilon': (lambda v: 0 <= v < math.inf, 'a finite number >= 0'),
    'initial_accumulator': (lambda v: 0 <= v < math.inf, 'a finite number >= 0'),
}


class HyperparameterError(ValueError):
  """A hyperparameter out of its range (`HParams` says it as its --client_/--server_ flag)."""

  def __init__(self, optimizer: str, field: str, rule: str, value: float):
    what = 'learning rate' if field == 'learning_rate' else f'{optimizer} {field}'
    super().__init__(f'{what} must be {rule}, got {value}')
    self.optimizer, self.field, self.rule, self.value = optimizer, field, rule, value


def hyperparameters(name: str) -> tuple[str, ...]:
  """The hyperparameters (besides the learning rate) optimiser `name` has."""
  return tuple(_DEFAULTS[name])


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  name: str = 'sgd'
  learning_rate: float = 1.0
  momentum: Optional[float] = None
  beta_1: Optional[float] = None
  beta_2: Optional[float] = None      # RMSProp: the decay of its average
  epsilon: Optional[float] = None
  initial_accumulator: Optional[float] = None

  def __post_init__(self):
    if self.name not in NAMES:
      raise ValueError(f'unknown optimizer {self.name!r}; choose one of {NAMES}')
    for field, (ok, rule) in _RANGES.items():
      value = getattr(self, field)
      if value is not None and not ok(value):  # nan fails every rule
        raise HyperparameterError(self.name, field, rule, value)

  def unused(self) -> list[str]:
    """The hyperparameters set here that this optimiser does not have (e.g.
    a momentum for plain sgd): they would be dropped without a word."""
    return [f for f in HYPERPARAMETERS
            if getattr(self, f) is not None and f not in _DEFAULTS[self.name]]

  def get(self, field: str):
    value = getattr(self, field)
    return _DEFAULTS[self.name].get(field) if value is None else value

  def build(self) -> tff.learning.optimizers.Optimizer:
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top,redefined-outer-name
    lr, g = self.learning_rate, self.get
    if self.name == 'sgd':
      return tff.learning.optimizers.build_sgdm(learning_rate=lr)
    if self.name == 'sgdm':
      return tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=g('momentum'))
    if self.name == 'adam':
      return tff.learning.optimizers.build_adam(
          learning_rate=lr, beta_1=g('beta_1'), beta_2=g('beta_2'), epsilon=g('epsilon'))
    if self.name == 'yogi':
      return tff.learning.optimizers.build_yogi(
          learning_rate=lr, beta_1=g('beta_1'), beta_2=g('beta_2'), epsilon=g('epsilon'),
          initial_preconditioner_value=g('initial_accumulator'))
    if self.name == 'adagrad':
      from tff_algos.core.keras_adagrad import KerasAdagrad  # pylint: disable=g-import-not-at-top
      return KerasAdagrad(lr, epsilon=g('epsilon'),
                          initial_accumulator=g('initial_accumulator'))
    if self.name == 'adagrad_tff':
      return tff.learning.optimizers.build_adagrad(
          learning_rate=lr, epsilon=g('epsilon'),
          initial_preconditioner_value=g('initial_accumulator'))
    return tff.learning.optimizers.build_rmsprop(
        learning_rate=lr, decay=g('beta_2'), epsilon=g('epsilon'))
