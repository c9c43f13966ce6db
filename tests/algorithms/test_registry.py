"""The algorithm registry: one line per algorithm, each naming a config class
that imports no TensorFlow and a builder; the Python API's defaults are the
binaries'."""

import inspect
import os
import subprocess
import sys

import pytest

from paths import ROOT
from tff_algos.algorithms import registry
from tff_algos.core import hparams


def test_every_algorithm_of_the_papers_is_registered():
  assert {'fedavg', 'fedsgd', 'local_update', 'local_update_decay', 'reptile', 'fomaml',
          'kmaml', 'minibatch_sgd', 'nastya', 'fedrr', 'feddyn', 'scaffold', 'fedprox',
          'fedgbo', 'mfl', 'mimelite', 'mimexlite', 'fedmax', 'fednova'} <= set(
              registry.ALGORITHMS)
  with pytest.raises(ValueError, match=r"^unknown algorithm 'fedavgg' \(did you mean fedavg\?\); "
                     r"choose from .*fedavg.*scaffold"):
    registry.get('fedavgg')


def test_unknown_algorithm_names_are_said_one_way_in_every_binary():
  """feddyn, fedgbo and benchmark each worded their own refusal (a list repr,
  'registered:', 'known:'), none with the near miss."""
  assert registry.unknown(['fedavg', 'scaffold']) == ''
  said = registry.unknown(['fedavg', 'fedproxx', 'zzz'], '--algorithms')
  assert said.startswith("--algorithms: unknown algorithms 'fedproxx', 'zzz' "
                         "(did you mean fedprox?); choose from ")
  assert said.endswith(', '.join(sorted(registry.ALGORITHMS)))
  for binary in ('feddyn', 'fedgbo', 'benchmark'):
    source = open(os.path.join(ROOT, 'experiments', f'{binary}.py')).read()
    assert "registry.unknown(" in source and 'not in registry.ALGORITHMS' not in source, binary


@pytest.mark.parametrize('name', sorted(registry.ALGORITHMS))
def test_every_line_names_a_declared_config_and_a_builder(name):
  algorithm = registry.get(name)
  config_class = algorithm.config
  assert issubclass(config_class, hparams.Config)
  assert hparams.declarations(config_class), name
  assert set(algorithm.fixed) <= {f for f in hparams.declarations(config_class)} | {
      'gradient'}, name
  builder = algorithm.builder_fn()
  assert list(inspect.signature(builder).parameters)[:3] == ['model_fn', 'config', 'name']
  # The builder's default config is the config class's defaults.
  default = inspect.signature(builder).parameters['config'].default
  assert isinstance(default, config_class), name
  assert isinstance(algorithm.default_config(), config_class)


def test_the_registry_and_every_config_import_no_tensorflow():
  """The binaries answer flag questions from the configs before TensorFlow loads."""
  code = ('import sys\n'
          'from tff_algos.algorithms import registry\n'
          'from tff_algos.flags import algorithm_flags\n'
          'classes = registry.config_classes()\n'
          'print(len(classes), "tensorflow" in sys.modules, "tensorflow_federated" in sys.modules)')
  res = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert res.returncode == 0, res.stderr[-2000:]
  count, tf_loaded, tff_loaded = res.stdout.split()
  assert int(count) >= 14 and (tf_loaded, tff_loaded) == ('False', 'False'), res.stdout


# Every algorithm's config as the trainer builds it from default flags (absl
# parses `--algorithm=<name>` alone), against the Python API's default config.
_DEFAULTS = '''
import sys
from absl import flags
from experiments.lib import flags as trainer_flags
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
for name in sorted(registry.ALGORITHMS):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['train', f'--algorithm={name}'])
  from_flags = algorithm_flags.config(name, trainer_flags.hparams())
  python_api = registry.get(name).default_config()
  print(name, from_flags == python_api, type(python_api).__name__)
nastya = registry.get('nastya').config()
flags.FLAGS.unparse_flags()
flags.FLAGS(['train', '--algorithm=nastya'])
print('gamma', nastya.client_learning_rate, trainer_flags.hparams().client_learning_rate)
'''


def test_the_python_api_defaults_are_the_binaries_defaults():
  """For every registered algorithm, its config with no arguments (its
  registry line's fixed fields aside) equals the config the trainer builds from
  its default flags: one source of defaults (NastyaConfig trained at gamma =
  0.01 where --algorithm=nastya trained at 0.1)."""
  res = subprocess.run([sys.executable, '-c', _DEFAULTS], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert res.returncode == 0, res.stderr[-3000:]
  lines = res.stdout.strip().splitlines()
  rows = [line.split() for line in lines[:-1]]
  assert sorted(r[0] for r in rows) == sorted(registry.ALGORITHMS)
  assert [r for r in rows if r[1] != 'True'] == [], rows
  assert lines[-1] == 'gamma 0.1 0.1'
