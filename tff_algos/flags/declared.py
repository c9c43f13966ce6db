"""Flags from declared configs: one absl flag per declared field (`core.hparams`).

`specs(classes)` merges the declarations of config classes into flag specs
(a flag that several classes declare must agree on its kind and default;
`reuse` and `redefault` make that so); `define(specs, module_name)` defines
them with absl; `to_field` / `to_flag` convert a value between the two forms
(a list flag's strings and a tuple field); `said(error)` is a `ConfigError`
said with flags. No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Optional

from tff_algos.core import hparams
from tff_algos.core.hparams import ConfigError, Declared

_SCALARS = (bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class FlagSpec:
  name: str
  kind: Any                # bool, int, float, str, or tuple (a list flag)
  element: Any             # a list flag's elements (int, float, str)
  default: Any             # as absl holds it (a list flag: a list, or None)
  help: str
  choices: Optional[tuple[str, ...]] = None
  valid: Optional[hparams.Range] = None


def spec_of(declared: Declared) -> FlagSpec:
  h = declared.hparam
  kind, element = declared.kind, None
  if kind not in _SCALARS:
    args = [a for a in getattr(kind, '__args__', ()) if a is not Ellipsis]
    scalar = [a for a in args if a in _SCALARS]
    if getattr(kind, '__origin__', None) is tuple and args:
      kind, element = tuple, args[0]
    elif str in scalar:  # e.g. Theta: a preset name or a tuple of weights
      kind = str
    else:
      raise TypeError(f'{declared.field}: no flag kind for {declared.kind!r}')
  default = h.default
  if kind is tuple:
    default = list(map(str, default)) if default else None
  return FlagSpec(declared.flag, kind, element, default, h.help, h.choices, h.valid)


def specs(classes: Iterable[type]) -> dict[str, FlagSpec]:
  """Flag name -> spec, over the declarations of `classes` in their order."""
  found: dict[str, FlagSpec] = {}
  for cls in classes:
    for declared in hparams.declarations(cls).values():
      spec = spec_of(declared)
      old = found.get(spec.name)
      if old is None:
        found[spec.name] = spec
      elif (old.kind, old.element, old.default) != (spec.kind, spec.element, spec.default):
        raise TypeError(f'--{spec.name} is declared twice, differently: {old} and {spec} '
                        f'({cls.__name__}); use core.hparams.reuse')
      elif not old.help and spec.help:
        found[spec.name] = spec
  return found


def define(flag_specs: Iterable[FlagSpec], module_name: str, flag_values=None,
           help_of=lambda spec: spec.help) -> None:
  """absl flags for `flag_specs`, owned by `module_name` (whose flags a binary
  reads with `FLAGS.get_flags_for_module`)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  for spec in flag_specs:
    kw = dict(flag_values=flag_values, module_name=module_name)
    text = help_of(spec)
    if spec.choices:
      flags.DEFINE_enum(spec.name, spec.default, spec.choices, text, **kw)
    elif spec.kind is tuple:
      flags.DEFINE_list(spec.name, spec.default, text, **kw)
    else:
      define_kind = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer,
                     float: flags.DEFINE_float, str: flags.DEFINE_string}[spec.kind]
      define_kind(spec.name, spec.default, text, **kw)


def to_field(spec: FlagSpec, value):
  """A flag's value as its field holds it (a list flag's strings: a tuple of
  its elements); refuses (`ConfigError`) an element that is not one and a
  float flag with a declared range that is not finite (a flag of inf or NaN
  is a mistake: a range with no upper bound would take inf)."""
  if spec.kind is tuple:
    try:
      return tuple(spec.element(v) for v in (value or ()))
    except ValueError:
      what = {int: 'whole numbers', float: 'numbers'}.get(spec.element, 'values')
      raise hparams.refuse('{%s} takes %s, comma-separated; got {value}' % (spec.name, what),
                           value=','.join(value)) from None
  if (spec.kind is float and spec.valid is not None and value is not None
      and not math.isfinite(value)):  # (the optimisers' own ranges say theirs)
    rule = dataclasses.replace(spec.valid, finite=True)
    raise hparams.out_of_range(spec.name, rule, value)
  return value


def to_flag(spec: FlagSpec, value):
  """A field's value as its flag holds it (a tuple: a list of strings, or None)."""
  if spec.kind is tuple:
    return list(map(str, value)) if value else None
  return value


def said(error: ConfigError, flag_of: Optional[dict[str, str]] = None,
         algorithm: str = '') -> str:
  """`error` with its fields said as their flags (`flag_of`: field -> flag,
  else the config's own declarations) and `{algorithm}` as `algorithm`."""
  names = flag_of if flag_of is not None else hparams.field_flags(error.config)
  return error.said(lambda field: algorithm if field == 'algorithm'
                    else f'--{names.get(field, field)}')
