"""The algorithms as the binaries see them: flags derived from their configs.

Every algorithm flag is a field that some algorithm's config declares (the
groups of `tff_algos.algorithms.groups` and each algorithm's `config.py`):
its name, default and help come from there (`SPECS`), and so does which
algorithms read it (`reads`). `HParams` holds a value for every such flag,
as the binaries pass one set of flags to runs of several algorithms. For one
algorithm (`config(name, hp, unset)`):

* a flag it does not read, set to other than its default, is refused, with
  the reason its config gives (`WHY_NOT`) or the algorithms that read it;
* flags left unset (`unset`) take the algorithm's own defaults (FedGBO's
  SGDm and K = 10), so the binaries' defaults are the Python API's;
* its config checks the values, and the refusal names their flags.

Everything here answers before TensorFlow loads: the configs import none.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable

from tff_algos.algorithms import groups
from tff_algos.algorithms import registry
from tff_algos.core import hparams
from tff_algos.core.hparams import ConfigError
from tff_algos.flags import declared

SPECS: dict[str, declared.FlagSpec] = declared.specs(registry.config_classes())


@functools.lru_cache(maxsize=None)
def reads(name: str) -> frozenset[str]:
  """The flags algorithm `name` reads: its config's fields, but those its
  registry line fixes."""
  algorithm = registry.get(name)
  return frozenset(d.flag for d in hparams.declarations(algorithm.config).values()
                   if d.field not in algorithm.fixed)


def readers(flag: str) -> list[str]:
  """The algorithms that read `flag`, by name."""
  return sorted(n for n in registry.ALGORITHMS if flag in reads(n))


def _algorithm_defaults(spec: declared.FlagSpec) -> str:
  """' (fedgbo, mfl: 10)': the algorithms whose own default of the flag differs."""
  by_value: dict[str, list[str]] = {}
  for name, algorithm in registry.ALGORITHMS.items():
    if spec.name not in reads(name):
      continue
    field = {d.flag: d for d in hparams.declarations(algorithm.config).values()}
    value = declared.to_flag(spec, field[spec.name].default)
    if value != spec.default:
      by_value.setdefault(repr(value) if isinstance(value, str) else str(value), []).append(name)
  return ''.join(f' ({", ".join(names)}: {value})' for value, names in by_value.items())


def help_text(spec: declared.FlagSpec) -> str:
  """A flag's help, with the algorithms' own defaults where they differ."""
  return spec.help + _algorithm_defaults(spec)


def _make_hparams():
  fields = [(name, Any, dataclasses.field(default=spec.default, metadata={
      'help': help_text(spec), 'choices': spec.choices}))
            for name, spec in SPECS.items()]
  cls = dataclasses.make_dataclass('HParams', fields, frozen=True)
  cls.__module__ = __name__
  cls.__doc__ = 'A value for every algorithm flag (their defaults unless given).'
  return cls


HParams = _make_hparams()


def _is_set(hp, flag: str) -> bool:
  value, default = getattr(hp, flag), SPECS[flag].default
  return value != default and not (default is None and value in ([], ()))


def _said(error: ConfigError, name: str) -> str:
  return declared.said(error, hparams.field_flags(error.config or
                                                  registry.get(name).config),
                       algorithm=name)


def check_ranges(hp) -> None:
  """Refuses (ValueError naming the flag) a value that is out of its declared
  range, or not finite, whichever algorithm runs."""
  for flag, spec in SPECS.items():
    if not _is_set(hp, flag):
      continue
    value = getattr(hp, flag)
    try:
      declared.to_field(spec, value)
      if spec.valid is not None and spec.kind in (int, float) and value not in spec.valid:
        raise hparams.out_of_range(flag, spec.valid, value)
    except ConfigError as e:
      raise ValueError(declared.said(e, {})) from None


def refuse_unread(name: str, hp) -> None:
  """Refuses (ValueError) the flags set in `hp` that algorithm `name` does not
  read: they would be dropped without a word."""
  unread = [f for f in SPECS if f not in reads(name) and _is_set(hp, f)]
  if not unread:
    return
  cls = registry.get(name).config
  plain = [f for f in unread if f not in cls.WHY_NOT]
  if plain:
    raise ValueError(f'--{plain[0]} is not used by {name} (only by '
                     f'{", ".join(readers(plain[0]))}); leave it at its default')
  reason = cls.WHY_NOT[unread[0]]
  same = [f'--{f}' for f in unread if cls.WHY_NOT[f] == reason]
  them = 'them at their defaults' if len(same) > 1 else 'it at its default'
  why = _said(ConfigError(reason, config=cls), name)
  raise ValueError(f'{name} does not use {", ".join(same)} ({why}); leave {them}')


def _yields(name: str, declared_field, unset: frozenset[str]) -> bool:
  """Whether an unset field falls back to None: the flag it yields to is one
  that `name` reads, and it is given (`--client_epochs_per_round` alone)."""
  other = declared_field.hparam.yields_to
  return bool(other) and other in reads(name) and other not in unset


def _field_values(name: str, hp, unset: Iterable[str]) -> dict[str, Any]:
  """The config fields of algorithm `name` from `hp` (those whose flags are in
  `unset` left out: at their defaults, or None where they yield to a flag
  that is given)."""
  algorithm, unset = registry.get(name), frozenset(unset)
  values = {}
  for d in hparams.declarations(algorithm.config).values():
    if d.field in algorithm.fixed:
      continue
    if d.flag in unset:
      if _yields(name, d, unset):
        values[d.field] = None
      continue
    values[d.field] = declared.to_field(SPECS[d.flag], getattr(hp, d.flag))
  return values


def config(name: str, hp=None, unset: Iterable[str] = ()):
  """Algorithm `name`'s config from the flag values `hp` (None: the defaults),
  the flags in `unset` at the algorithm's own defaults; refuses (ValueError
  naming the flags) what its config refuses."""
  algorithm = registry.get(name)
  try:
    values = _field_values(name, HParams() if hp is None else hp, unset)
    return algorithm.config(**algorithm.fixed, **values)
  except ConfigError as e:
    raise ValueError(_said(e, name)) from None


def check(name: str, hp, unset: Iterable[str] = ()) -> registry.Algorithm:
  """Every check, without TensorFlow: the name, the ranges, the flags `name`
  does not read, and its config's own (raise ValueError)."""
  algorithm = registry.get(name)
  check_ranges(hp)
  refuse_unread(name, hp)
  config(name, hp, unset)
  return algorithm



def with_defaults(name: str, hp, unset: Iterable[str]):
  """`hp` with algorithm `name`'s own defaults for the flags in `unset`."""
  algorithm = registry.get(name)
  unset = frozenset(unset)
  changes = {}
  for d in hparams.declarations(algorithm.config).values():
    if d.flag not in unset or d.field in algorithm.fixed:
      continue
    changes[d.flag] = (None if _yields(name, d, unset)
                       else declared.to_flag(SPECS[d.flag], d.default))
  return dataclasses.replace(hp, **changes)


def fixed_flags(name: str) -> dict[str, Any]:
  """The flags of the fields that algorithm `name`'s registry line fixes, at
  the values it runs with (kmaml's --theta: 'kmaml'); `name` does not read
  them, so their flag values say nothing of its run."""
  algorithm = registry.get(name)
  flag_of = hparams.field_flags(algorithm.config)
  return {flag_of[f]: declared.to_flag(SPECS[flag_of[f]], v)
          for f, v in algorithm.fixed.items() if f in flag_of}


def build(name: str, model_fn, hp=None, unset: Iterable[str] = ()):
  """`registry.build` of the config from the flag values `hp` (TensorFlow)."""
  return registry.build(name, model_fn, config(name, hp, unset))


def for_algorithm(name: str, hp):
  """`hp` with the flags that `name` does not read at their defaults: a grid
  passes one set of flags to several algorithms (`ignored_flags` says what
  each run drops)."""
  return dataclasses.replace(hp, **{f: SPECS[f].default for f in SPECS
                                    if f not in reads(name) and _is_set(hp, f)})


def ignored_flags(names, hp) -> dict[str, list[str]]:
  """Flags set in `hp` -> the algorithms of `names` that do not read them (a
  grid runs those without; its binary says so)."""
  ignoring = {f: [n for n in names if f not in reads(n)] for f in SPECS if _is_set(hp, f)}
  return {flag: names for flag, names in ignoring.items() if names}


def warnings(name: str, hp, unset: Iterable[str] = ()) -> list[str]:
  """Legal settings that are most likely a mistake (a client learning rate of
  0 outside the LocalUpdate family, ...), from the config's `advice`."""
  cfg = config(name, hp, unset)
  said = []
  for cls in reversed(type(cfg).__mro__):
    advice = vars(cls).get('advice')
    if advice is not None:
      said += [_said(ConfigError(t, config=type(cfg)), name) for t in advice(cfg)]
  return said


def without_unused_optimizer_hparams(hp):
  """`hp` with the --client_/--server_ hyperparameters that their optimisers
  lack unset: for binaries that pass one set of flags to runs of several
  optimisers (fedgbo's SGD baselines beside its SGDm algorithms)."""
  unset = {}
  for side in ('client', 'server'):
    try:
      spec = groups.optimizer_spec(hp, side, check_unused=False)
    except ConfigError as e:
      raise ValueError(declared.said(e, {})) from None
    unset.update({f'{side}_{field}': None for field in spec.unused()})
  return dataclasses.replace(hp, **unset) if unset else hp

