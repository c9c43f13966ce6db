"""Algorithm registry: names, and flags that only some algorithms read."""

import dataclasses
import os

import pytest

from paths import ROOT
from tff_algos.flags import registry
from tff_algos.flags.hparams import HParams


def test_every_algorithm_of_the_issues_is_registered():
  assert {'fedavg', 'fedsgd', 'local_update', 'local_update_decay', 'reptile', 'fomaml',
          'kmaml', 'minibatch_sgd', 'nastya', 'fedrr', 'feddyn', 'scaffold', 'fedprox',
          'fedgbo', 'mfl', 'mimelite', 'mimexlite', 'fedmax'} <= set(registry.ALGORITHMS)
  with pytest.raises(ValueError, match=r"^unknown algorithm 'fedavgg' \(did you mean fedavg\?\); "
                     r"choose from .*fedavg.*scaffold"):
    registry.get('fedavgg')


def test_grids_learn_which_of_their_algorithms_ignore_a_flag():
  hp = HParams(clip_norm=10.0, prox_mu=0.1)
  assert registry.ignored_flags(['fedgbo', 'fedavg', 'fedprox'], hp) == {
      'clip_norm': ['fedgbo'], 'prox_mu': ['fedgbo', 'fedavg']}
  assert registry.ignored_flags(['fedgbo', 'fedavg'], HParams()) == {}
  assert registry.ignored_flags(['feddyn', 'scaffold'], HParams(clip_norm=10.0)) == {}


@pytest.mark.parametrize('flag,value,users', [
    ('clip_norm', 10.0, {'feddyn', 'scaffold', 'fedavg', 'fedprox', 'fedmax'}),
    ('prox_mu', 0.1, {'fedprox'}),
    ('feddyn_alpha', 0.1, {'feddyn'}),
    ('fedmax_beta', 0.5, {'fedmax'}),
    ('server_adaptive_lr', True, {'nastya'}),
])
def test_algorithm_specific_flags_are_not_silently_ignored(flag, value, users):
  hp = dataclasses.replace(HParams(), **{flag: value})
  for name in ('fedavg', 'fedsgd', *users):
    if name in users:
      registry.check_specific_flags(name, hp)  # accepted
    else:
      with pytest.raises(ValueError, match=f'--{flag} is not used by {name}'):
        registry.check(name, hp)
  registry.check_specific_flags('fedavg', HParams())  # defaults are always fine


def test_flag_choices_are_the_registries_names():
  # --task and --algorithm are enums so that a misspelt name is refused before
  # TensorFlow loads; their choices must be exactly what the registries hold.
  from experiments.lib import flags as trainer_flags
  from tasks import list_tasks
  from tff_algos.flags import registry
  assert sorted(trainer_flags.TASK_NAMES) == sorted(list_tasks())
  assert sorted(trainer_flags.ALGORITHM_NAMES) == sorted(registry.ALGORITHMS)


def test_specific_flags_are_derived_from_the_specs():
  from tff_algos.flags import registry
  device_models = {'feddyn', 'scaffold', 'fedavg', 'fedprox'}
  assert registry.ALGORITHM_SPECIFIC_FLAGS == {
      'feddyn_alpha': {'feddyn'}, 'feddyn_adaptive_alpha': {'feddyn'},
      'feddyn_weight_decay_form': {'feddyn'}, 'report_device_average': device_models,
      'client_weight_decay': device_models | {'fedmax'}, 'clip_norm': device_models | {'fedmax'},
      'prox_mu': {'fedprox'}, 'scaffold_reference_conventions': {'scaffold'},
      'fedmax_beta': {'fedmax'}, 'fedmax_reference_kl': {'fedmax'},
      'gbo_reference_conventions': {'fedgbo', 'mfl', 'mimelite', 'mimexlite'},
      'server_adaptive_lr': {'nastya'}, 'client_lr_milestones': {'nastya', 'fedrr'},
      'token_weighting': {'fedavg'}, 'theta': {'local_update', 'local_update_decay'},
      'decay_reference_semantics': {'local_update', 'reptile', 'fomaml', 'kmaml',
                                    'minibatch_sgd', 'local_update_decay'},
      **{flag: {'local_update_decay'} for flag in (
          'decay_min_delta', 'client_lr_decay_factor', 'server_lr_decay_factor',
          'decay_patience', 'decay_window', 'decay_cooldown')}}


def test_every_spec_names_a_config_and_a_builder_of_its_module():
  import importlib
  import inspect
  from tff_algos.flags import registry
  for spec in registry.ALGORITHMS.values():
    module = importlib.import_module(spec.module)
    config_class = getattr(module, spec.config)
    assert inspect.signature(config_class.from_hparams).bind(HParams(), **spec.config_args)
    assert list(inspect.signature(getattr(module, spec.builder)).parameters)[:3] == [
        'model_fn', 'config', 'name'], spec.name
    one_pass = spec.name in ('nastya', 'fedrr', 'fedsgd')  # they take no --local_steps
    hp = HParams() if one_pass else HParams(local_steps=2)
    unset = {f.name for f in dataclasses.fields(HParams)} - {'local_steps'}
    assert isinstance(registry.config(spec.name, registry.with_defaults(spec.name, hp, unset)),
                      config_class)


def test_a_spec_config_arg_tells_algorithms_of_one_config_apart():
  from tff_algos.flags import registry
  hp = HParams(local_steps=3)
  assert registry.config('reptile', hp).theta == (1.0, 1.0, 1.0)
  assert registry.config('fomaml', hp).theta == (0.0, 0.0, 1.0)
  assert registry.config('mimexlite', registry.with_defaults(
      'mimexlite', hp, {'client_optimizer'})).gradient == 'one_batch'
  assert registry.config('fedavg', HParams()).mu == 0.0  # --prox_mu is FedProx's


# Parses a bad command line as the trainer does and validates it; prints the
# error and whether TensorFlow had been imported by then.
_VALIDATE = '''
import sys
from absl import flags
from experiments.lib import flags as trainer_flags
flags.FLAGS(['train', *sys.argv[1:]])
try:
  trainer_flags.validate()
except trainer_flags.FlagError as e:
  print(e)
print('tensorflow' in sys.modules, 'tensorflow_federated' in sys.modules)
'''


@pytest.mark.parametrize('argv,message', [
    ('--algorithm=fedavg --local_steps_decay=0.9', 'local_steps_decay needs local_steps'),
    ('--algorithm=fedgbo --prox_mu=0.5', '--prox_mu is not used by fedgbo'),
    ('--algorithm=feddyn --server_optimizer=adam', 'feddyn does not use --server_optimizer'),
    ('--algorithm=fedrr --server_learning_rate=2', 'fedrr has no server step'),
    ('--algorithm=mfl --client_optimizer=yogi', 'MFL averages client optimiser state'),
    ('--algorithm=kmaml --client_optimizer=adam', 'kmaml does not use --client_optimizer'),
    ('--algorithm=fednova --server_optimizer=adam', 'fednova does not use --server_optimizer'),
    # Flags that were dropped without a word (a first-hour review, session 27).
    ('--algorithm=reptile --theta=1,2', '--theta is not used by reptile (only by '
                                         'local_update, local_update_decay)'),
    ('--algorithm=fedavg --decay_patience=5', '--decay_patience is not used by fedavg'),
    ('--algorithm=fedavg --decay_reference_semantics', '--decay_reference_semantics is not '
                                                       'used by fedavg'),
    ('--algorithm=fedavg --server_momentum=0.5', '--server_momentum is not used by '
     '--server_optimizer=sgd (it takes only the learning rate); leave it unset or use '
     '--server_optimizer=sgdm'),
    ('--algorithm=fedavg --server_optimizer=adagrad --server_beta_1=0.9',
     '--server_beta_1 is not used by --server_optimizer=adagrad (it takes '
     '--server_epsilon, --server_initial_accumulator)'),
    ('--algorithm=fedgbo --client_optimizer=rmsprop --client_beta_1=0.9',
     '--client_beta_1 is not used by --client_optimizer=rmsprop'),
])
def test_bad_algorithm_flags_are_answered_without_tensorflow(argv, message):
  import subprocess
  import sys
  root = ROOT
  res = subprocess.run([sys.executable, '-c', _VALIDATE, *argv.split()], cwd=root,
                       env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True,
                       timeout=120)
  assert res.returncode == 0, res.stderr[-2000:]
  error, loaded = res.stdout.strip().splitlines()
  assert message in error
  assert loaded == 'False False', res.stdout


def test_a_zero_client_learning_rate_is_a_warning_outside_the_local_update_family():
  from tff_algos.flags import rules as flag_rules
  zero = HParams(client_learning_rate=0.0)
  for name in ('fedavg', 'feddyn', 'scaffold', 'fedprox', 'fedgbo', 'mfl'):
    (warning,) = flag_rules.warnings(name, zero)
    assert warning.startswith(f'--client_learning_rate=0: {name} clients do not move')
    assert flag_rules.warnings(name, HParams()) == []
  for name in flag_rules.ZERO_CLIENT_STEP_OK:
    assert name in registry.ALGORITHMS and flag_rules.warnings(name, zero) == []


def test_a_zero_server_learning_rate_is_a_warning_but_as_an_adaptive_start():
  from tff_algos.flags import rules as flag_rules
  zero = HParams(server_learning_rate=0.0)
  for name in ('fedavg', 'scaffold', 'reptile', 'nastya'):
    (warning,) = flag_rules.warnings(name, zero)
    assert warning.startswith(f'--server_learning_rate=0: the {name} server never moves')
  assert flag_rules.warnings('nastya', HParams(server_learning_rate=0.0,
                                               server_adaptive_lr=True)) == []


def test_the_local_update_flags_are_accepted_where_they_are_read():
  """--theta and the plateau flags pass every check where they are read (the
  refusals elsewhere: `test_bad_algorithm_flags_are_answered_without_tensorflow`)."""
  registry.check_flags('local_update', HParams(theta='1,0,0.5'))
  registry.check('local_update_decay', HParams(theta='fomaml', decay_patience=5,
                                                decay_reference_semantics=True))
  registry.check('kmaml', HParams(decay_reference_semantics=True))


def test_unknown_algorithm_names_are_said_one_way_in_every_binary():
  """feddyn, fedgbo and benchmark each worded their own refusal (a list repr,
  'registered:', 'known:'), none with the near miss."""
  assert registry.unknown(['fedavg', 'scaffold']) == ''
  said = registry.unknown(['fedavg', 'fedproxx', 'zzz'], '--algorithms')
  assert said.startswith("--algorithms: unknown algorithms 'fedproxx', 'zzz' "
                         "(did you mean fedprox?); choose from ")
  assert said.endswith(', '.join(sorted(registry.ALGORITHMS)))
  for binary in ('feddyn', 'fedgbo', 'benchmark'):
    source = open(os.path.join(ROOT,
                               'experiments', f'{binary}.py')).read()
    assert "registry.unknown(" in source and 'not in registry.ALGORITHMS' not in source, binary


def test_grids_drop_uniform_weighting_for_the_equal_weighted_algorithms():
  """The trainer refuses --uniform_weighting for FedDyn/SCAFFOLD (their means
  are equal-weighted already); a grid's FedAvg beside them takes it (fedgbo
  sets it for every run, feddyn's README gives it for FedAvg/FedProx), so the
  grid drops it for those two with a note instead of refusing the grid."""
  hp = HParams(uniform_weighting=True)
  assert registry.for_algorithm('feddyn', hp).uniform_weighting is False
  assert registry.for_algorithm('scaffold', hp).uniform_weighting is False
  assert registry.for_algorithm('fedavg', hp).uniform_weighting is True
  registry.check_flags('scaffold', registry.for_algorithm('scaffold', hp))  # not refused
  with pytest.raises(ValueError, match='scaffold does not use --uniform_weighting'):
    registry.check_flags('scaffold', hp)
  assert registry.ignored_flags(['fedavg', 'feddyn', 'scaffold'], hp) == {
      'uniform_weighting': ['feddyn', 'scaffold']}
  assert registry.ignored_flags(['fedavg', 'feddyn'], HParams()) == {}
