"""Hyperparameters declared once: a config's fields with their flags.

A config (an algorithm's, the round loop's `RunConfig`, a task's options) is a
frozen dataclass deriving from `Config`, its fields declared with `hparam`:

    @dataclasses.dataclass(frozen=True)
    class FedDynConfig(groups.ClientSGD, groups.LocalWork):
      alpha: float = hparam(0.01, 'FedDyn: dynamic regulariser alpha.',
                            flag='feddyn_alpha', valid=above(0))

      def check(self):
        if self.alpha > 1e6:
          raise refuse('{alpha} is huge')

Each declaration says the field's flag (its name unless `flag=`), default,
help and valid range or choices; `redefault(value)` redeclares an inherited
field at another default (an algorithm's own). The flag layer
(`tff_algos.flags`) defines the binaries' flags from the declarations, so
nothing restates them. On construction a config checks

* every declared field against its range or choices;
* then each class's own `check(self)`, the inherited ones first: the
  restrictions, raising `refuse(template)`, a `ConfigError` whose template
  names fields in braces (`'{local_steps} must be >= 1'`): the Python API says
  them as fields, the binaries as their flags (`--local_steps`).

`WHY_NOT` tells, for flags of other configs that this one has no field for,
why (the binaries' refusal of such a flag says it). Fields declared without
`hparam` are the Python API's alone (no flag). This module imports neither
TensorFlow nor absl.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence
import typing

_KEY = 'tff_algos.hparam'


@dataclasses.dataclass(frozen=True)
class Range:
  """An interval of numbers, said as a rule ('>= 0', 'in (0, 1] (1: no decay)',
  'a finite number > 0')."""
  low: float = -math.inf
  high: float = math.inf
  low_open: bool = False
  high_open: bool = False
  note: str = ''
  finite: bool = False

  def __contains__(self, value) -> bool:
    above_low = value > self.low if self.low_open else value >= self.low
    below_high = value < self.high if self.high_open else value <= self.high
    finite = not self.finite or (value != math.inf and value != -math.inf)
    return bool(above_low and below_high and finite)  # NaN is in no range

  def __str__(self) -> str:
    note = f' {self.note}' if self.note else ''
    if self.high == math.inf:
      number = 'a finite number ' if self.finite else ''
      return f'{number}{">" if self.low_open else ">="} {self.low:g}{note}'
    if self.low == -math.inf:
      return f'{"<" if self.high_open else "<="} {self.high:g}{note}'
    return (f'in {"(" if self.low_open else "["}{self.low:g}, {self.high:g}'
            f'{")" if self.high_open else "]"}{note}')


def at_least(low: float, note: str = '', finite: bool = False) -> Range:
  return Range(low=low, note=note, finite=finite)


def above(low: float, note: str = '', finite: bool = False) -> Range:
  return Range(low=low, low_open=True, note=note, finite=finite)


def within(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
           note: str = '') -> Range:
  return Range(low, high, low_open, high_open, note)


INT32_MAX = 2**31 - 1  # the largest integer field: TensorFlow counts rounds and steps in int32
DECAY = within(0, 1, low_open=True, note='(1: no decay)')  # a factor d of d^t
FRACTION = within(0, 1, high_open=True)                    # a moment's beta


@dataclasses.dataclass(frozen=True)
class HParam:
  """What a field's declaration says besides its default."""
  help: str
  flag: Optional[str] = None            # None: the field's own name
  default: Any = None                   # the declaring class's default
  valid: Optional[Range] = None
  choices: Optional[tuple[str, ...]] = None
  # A field that falls back to None when the field named here is given and it
  # is not (K steps yield to E epochs: `--client_epochs_per_round` alone asks
  # for epochs even where an algorithm's own default is a K).
  yields_to: Optional[str] = None
  # False: `choices` are the flag's, and whoever reads the field refuses the
  # rest with a better message (a task names the splits it reads).
  enforce_choices: bool = True


def hparam(default, help_text: str, *, flag: Optional[str] = None,
           valid: Optional[Range] = None, choices: Optional[Sequence[str]] = None,
           yields_to: Optional[str] = None, enforce_choices: bool = True) -> Any:
  """A declared field (see the module docstring)."""
  declared = HParam(help_text, flag, default, valid, tuple(choices) if choices else None,
                    yields_to, enforce_choices)
  return dataclasses.field(default=default, metadata={_KEY: declared})


_REDEFAULT = object()


def redefault(default) -> Any:
  """An inherited field at another default: `local_steps: Optional[int] = redefault(10)`."""
  return dataclasses.field(default=default, metadata={_KEY: _REDEFAULT})


class ConfigError(ValueError):
  """A config value out of its range, or against a restriction.

  The template names fields in braces and values by keyword (`refuse`):
  `str(e)` says the fields by name, `said(name_of)` as `name_of(field)`
  gives them (the binaries: their flags). `{algorithm}` is the algorithm's
  name (the config class's, unless the caller says another). `config` is the
  config's class.
  """

  def __init__(self, template: str, values: Optional[Mapping[str, Any]] = None,
               config: Optional[type] = None):
    self.template, self.values, self.config = template, dict(values or {}), config
    super().__init__(template)

  def said(self, name_of: Callable[[str], str]) -> str:
    return self.template.format_map(_Names(self.values, name_of))

  def __str__(self) -> str:
    name = '' if self.config is None else self.config.__name__.removesuffix('Config')
    return self.said(lambda field: name or 'the algorithm' if field == 'algorithm' else field)

  def __reduce__(self):  # what a --jobs worker sends back
    return ConfigError, (self.template, self.values, self.config)


class _Names(dict):
  """Values by keyword; any other name in braces is a field, said by `name_of`."""

  def __init__(self, values, name_of):
    super().__init__(values)
    self._name_of = name_of

  def __missing__(self, key):
    return self._name_of(key)


def refuse(template: str, **values) -> ConfigError:
  """The error to raise for a restriction: fields in braces, values by keyword
  (`refuse('{local_steps} must be >= 1, got {k}', k=k)`)."""
  return ConfigError(template, values)


def out_of_range(field: str, rule, value) -> ConfigError:
  """'{field} must be <rule>, got <value>': a value outside its declared range."""
  return refuse('{%s} must be %s, got {value}' % (field, rule), value=value)


@dataclasses.dataclass(frozen=True)
class Declared:
  """One declared field of a config class."""
  field: str                 # the dataclass field
  flag: str                  # its flag
  default: Any               # this class's default
  hparam: HParam             # the declaration (its `default`: the declaring class's)
  kind: Any                  # the annotation, Optional removed (int, float, bool, str, tuple)
  optional: bool             # None allowed


class Config:
  """Base of declared configs: checks the declared ranges, then each class's
  own `check` (inherited ones first)."""

  WHY_NOT: ClassVar[Mapping[str, str]] = {}

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    inherited = {}
    for base in reversed(cls.__mro__[1:]):
      if dataclasses.is_dataclass(base):
        inherited.update({f.name: f for f in dataclasses.fields(base)})
    for name, value in list(vars(cls).items()):
      if isinstance(value, dataclasses.Field) and value.metadata.get(_KEY) is _REDEFAULT:
        if name not in inherited or _KEY not in inherited[name].metadata:
          raise TypeError(f'{cls.__name__}.{name}: redefault() needs an inherited hparam')
        setattr(cls, name, dataclasses.field(default=value.default,
                                             metadata=inherited[name].metadata))

  def __post_init__(self):
    try:
      for declared in declarations(type(self)).values():
        _check_value(declared, getattr(self, declared.field))
      for cls in reversed(type(self).__mro__):
        own = vars(cls).get('check')
        if own is not None:
          own(self)
    except ConfigError as e:
      if e.config is None:
        e.config = type(self)
      raise

  def replace(self, **changes):
    """This config with `changes` (checked again)."""
    return dataclasses.replace(self, **changes)


def _check_value(declared: Declared, value) -> None:
  if value is None:
    if not declared.optional:
      raise refuse('{%s} must be set' % declared.field)
    return
  h = declared.hparam
  if h.choices is not None and h.enforce_choices and value not in h.choices:
    raise refuse('{%s} must be one of %s, got {value!r}' % (declared.field, ', '.join(h.choices)),
                 value=value)
  if declared.kind is int and isinstance(value, int) and abs(value) > INT32_MAX:
    raise refuse('{%s} must be at most %d (a 32-bit integer in TensorFlow), got {value}'
                 % (declared.field, INT32_MAX), value=value)
  # Numbers (also `lanes.Lanes`, one per lane: a rule holds where it holds in every lane).
  if h.valid is not None and not isinstance(value, (str, bytes, tuple, list)) and (
      value not in h.valid):
    raise out_of_range(declared.field, h.valid, value)


@functools.lru_cache(maxsize=None)
def declarations(cls: type) -> dict[str, Declared]:
  """The declared fields of config class `cls`, by field name, in field order."""
  found = {}
  for f in dataclasses.fields(cls):
    h = f.metadata.get(_KEY)
    if not isinstance(h, HParam):
      continue
    kind, optional = _unwrap(_annotation(cls, f.name))
    found[f.name] = Declared(f.name, h.flag or f.name, f.default, h, kind, optional)
  return found


def _annotation(cls: type, name: str):
  """Field `name`'s annotation, resolved in the module of the class that wrote it."""
  for klass in cls.__mro__:
    written = vars(klass).get('__annotations__', {})
    if name in written:
      value = written[name]
      if isinstance(value, str):
        value = eval(value, vars(sys.modules[klass.__module__]))  # pylint: disable=eval-used
      return value
  raise TypeError(f'{cls.__name__}.{name} has no annotation')


def _unwrap(annotation) -> tuple[Any, bool]:
  """(the annotation without Optional, whether None is allowed)."""
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) is typing.Union and type(None) in args:
    rest = [a for a in args if a is not type(None)]
    return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
  return annotation, False


def field_flags(cls: Optional[type]) -> dict[str, str]:
  """Field name -> flag name of config class `cls` ({} for None)."""
  return {} if cls is None else {d.field: d.flag for d in declarations(cls).values()}


def convert(config, cls: type, **changes):
  """A `cls` config with the values of `config`'s fields of the same names
  (and `changes`): FedNova's round is FedOpt's at FedNova's schedule."""
  names = {f.name for f in dataclasses.fields(cls)}
  values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.name in names}
  return cls(**{**values, **changes})


def reuse(cls: type, name: str, default) -> Any:
  """Field `name` of config class `cls` (its flag, help and range) at another
  default, for a config that does not derive from `cls`: LocalUpdate's K is
  `--local_steps` as `LocalWork` declares it, at 10."""
  (found,) = [f for f in dataclasses.fields(cls) if f.name == name]
  return dataclasses.field(default=default, metadata=found.metadata)
