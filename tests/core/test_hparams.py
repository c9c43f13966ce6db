"""The declaration API (`core.hparams`): ranges and choices checked on
construction, each class's own `check` (inherited ones first), refusals said
with field or flag names, another default for an inherited field, and a
field reused at another default."""

import dataclasses
import math
from typing import Optional

import pytest

from tff_algos.core import hparams
from tff_algos.core.hparams import Config, ConfigError, above, at_least, hparam, refuse, within


@dataclasses.dataclass(frozen=True, kw_only=True)
class Base(Config):
  rate: float = hparam(0.1, 'A rate.', valid=at_least(0))
  steps: Optional[int] = hparam(None, 'Steps (unset: epochs).', valid=at_least(1),
                                yields_to='epochs')
  kind: str = hparam('a', 'A kind.', choices=('a', 'b'))
  calls: list = dataclasses.field(default_factory=list, compare=False)  # no flag

  def check(self):
    self.calls.append('Base')
    if self.kind == 'b' and self.steps is None:
      raise refuse('kind b needs {steps}, got {kind}={value!r}', value=self.kind)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Derived(Base):
  steps: Optional[int] = hparams.redefault(10)
  alpha: float = hparam(0.5, 'An alpha.', flag='derived_alpha', valid=above(0))

  def check(self):
    self.calls.append('Derived')


def test_declared_fields_say_their_flag_default_help_and_kind():
  declared = hparams.declarations(Derived)
  assert set(declared) == {'rate', 'steps', 'kind', 'alpha'}   # `calls` has no hparam
  assert declared['alpha'].flag == 'derived_alpha' and declared['rate'].flag == 'rate'
  assert declared['steps'].default == 10 and declared['steps'].hparam.default is None
  assert (declared['steps'].kind, declared['steps'].optional) == (int, True)
  assert declared['rate'].hparam.help == 'A rate.'
  assert hparams.field_flags(Derived)['alpha'] == 'derived_alpha'


def test_ranges_and_choices_are_checked_on_construction():
  with pytest.raises(ConfigError, match=r'^rate must be >= 0, got -1$'):
    Base(rate=-1)
  with pytest.raises(ConfigError, match=r'^rate must be >= 0, got nan$'):
    Base(rate=math.nan)                 # NaN is in no range
  with pytest.raises(ConfigError, match=r"^kind must be one of a, b, got 'c'$"):
    Base(kind='c')
  with pytest.raises(ConfigError, match='alpha must be > 0'):
    Derived(alpha=0.0)
  Base(rate=math.inf, steps=None)       # inf is >= 0; the binaries refuse it as a flag


def test_each_class_checks_its_own_restrictions_inherited_first():
  assert Derived().calls == ['Base', 'Derived']
  with pytest.raises(ConfigError) as e:
    Base(kind='b')
  assert str(e.value) == "kind b needs steps, got kind='b'"
  assert e.value.config is Base
  # The binaries say it with flags; a field of another config is said as its name.
  said = e.value.said(lambda field: f'--{field}')
  assert said == "kind b needs --steps, got --kind='b'"


def test_a_refusal_can_name_the_algorithm():
  error = ConfigError('{algorithm} needs {alpha}', config=Derived)
  assert str(error) == 'Derived needs alpha'
  assert error.said(lambda f: 'x' if f == 'algorithm' else f'--{f}') == 'x needs --alpha'


def test_redefault_needs_an_inherited_declaration():
  with pytest.raises(TypeError, match='redefault'):
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Bad(Config):  # pylint: disable=unused-variable
      rate: float = hparams.redefault(1.0)


def test_reuse_takes_another_class_declaration_at_another_default():
  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Other(Config):
    steps: Optional[int] = hparams.reuse(Base, 'steps', 3)

  declared = hparams.declarations(Other)['steps']
  assert declared.hparam is hparams.declarations(Base)['steps'].hparam
  assert Other().steps == 3
  with pytest.raises(ConfigError, match='steps must be >= 1'):
    Other(steps=0)


def test_ranges_say_their_rule():
  assert str(at_least(0)) == '>= 0' and str(above(0, finite=True)) == 'a finite number > 0'
  assert str(hparams.DECAY) == 'in (0, 1] (1: no decay)'
  assert str(within(0, 1, high_open=True)) == 'in [0, 1)'
  assert 1.0 in hparams.DECAY and 0.0 not in hparams.DECAY
  assert math.inf in at_least(0) and math.inf not in above(0, finite=True)


def test_convert_carries_the_fields_of_the_same_name():
  converted = hparams.convert(Derived(rate=0.3, kind='b'), Base, steps=4)
  assert (type(converted), converted.rate, converted.kind, converted.steps) == (Base, 0.3,
                                                                              'b', 4)


def test_a_config_error_survives_a_worker_process():
  import pickle
  error = pickle.loads(pickle.dumps(ConfigError('{rate} is off by {value}', {'value': 2},
                                                Base)))
  assert (str(error), error.config) == ('rate is off by 2', Base)
