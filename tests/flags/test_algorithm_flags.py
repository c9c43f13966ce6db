"""The algorithm flags, derived from the configs' declarations: their names,
defaults and help, which algorithms read each, and the refusals of flags an
algorithm does not read, all answered before TensorFlow loads."""

import dataclasses
import os

import pytest

from paths import ROOT
from tff_algos.algorithms import registry
from tff_algos.core import hparams
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams


def test_every_algorithm_flag_is_a_declared_field():
  declared = {d.flag: d for cls in registry.config_classes()
              for d in hparams.declarations(cls).values()}
  assert set(algorithm_flags.SPECS) == set(declared)
  assert {f.name for f in dataclasses.fields(HParams)} == set(declared)
  for name, spec in algorithm_flags.SPECS.items():
    assert spec.help == declared[name].hparam.help and spec.help, name
  assert HParams().client_learning_rate == 0.1 and HParams().local_steps is None


def test_help_says_the_algorithms_own_defaults():
  help_of = {f.name: f.metadata['help'] for f in dataclasses.fields(HParams)}
  assert help_of['client_optimizer'].endswith("(fedgbo, mfl, mimelite, mimexlite: 'sgdm')")
  assert '10' in help_of['local_steps'] and 'fedgbo' in help_of['local_steps']


def test_grids_learn_which_of_their_algorithms_ignore_a_flag():
  hp = HParams(clip_norm=10.0, prox_mu=0.1)
  assert algorithm_flags.ignored_flags(['fedgbo', 'fedavg', 'fedprox'], hp) == {
      'clip_norm': ['fedgbo'], 'prox_mu': ['fedgbo', 'fedavg']}
  assert algorithm_flags.ignored_flags(['fedgbo', 'fedavg'], HParams()) == {}
  assert algorithm_flags.ignored_flags(['feddyn', 'scaffold'], HParams(clip_norm=10.0)) == {}


@pytest.mark.parametrize('flag,value,users', [
    ('clip_norm', 10.0, {'feddyn', 'scaffold', 'fedavg', 'fedprox', 'fedmax', 'fedsplit'}),
    ('prox_mu', 0.1, {'fedprox'}),
    ('feddyn_alpha', 0.1, {'feddyn'}),
    ('fedsplit_step_size', 0.5, {'fedsplit'}),
    ('fedmax_beta', 0.5, {'fedmax'}),
    ('server_adaptive_lr', True, {'nastya'}),
])
def test_algorithm_specific_flags_are_not_silently_ignored(flag, value, users):
  hp = dataclasses.replace(HParams(), **{flag: value})
  for name in ('fedavg', 'fedsgd', *users):
    if name in users:
      algorithm_flags.refuse_unread(name, hp)  # accepted
    else:
      with pytest.raises(ValueError, match=f'--{flag} is not used by {name}'):
        algorithm_flags.check(name, hp)
  algorithm_flags.refuse_unread('fedavg', HParams())  # defaults are always fine


def test_flag_choices_are_the_registries_names():
  # --task and --algorithm are enums so that a misspelt name is refused before
  # TensorFlow loads; their choices must be exactly what the registries hold.
  from experiments.lib import flags as trainer_flags
  from tasks import list_tasks
  assert sorted(trainer_flags.TASK_NAMES) == sorted(list_tasks())
  assert sorted(trainer_flags.ALGORITHM_NAMES) == sorted(registry.ALGORITHMS)


def test_which_algorithms_read_a_flag_is_derived_from_their_configs():
  device_models = {'feddyn', 'scaffold', 'fedavg', 'fedprox'}
  local_update = {'local_update', 'reptile', 'fomaml', 'kmaml', 'minibatch_sgd',
                  'local_update_decay'}
  expected = {
      'feddyn_alpha': {'feddyn'}, 'feddyn_adaptive_alpha': {'feddyn'},
      'feddyn_weight_decay_form': {'feddyn'}, 'report_device_average': device_models,
      'client_weight_decay': device_models | {'fedmax', 'fedsplit'},
      'clip_norm': device_models | {'fedmax', 'fedsplit'},
      'fedsplit_step_size': {'fedsplit'}, 'fedsplit_server_average': {'fedsplit'},
      'prox_mu': {'fedprox'}, 'scaffold_reference_conventions': {'scaffold'},
      'fedmax_beta': {'fedmax'}, 'fedmax_reference_kl': {'fedmax'},
      'gbo_reference_conventions': {'fedgbo', 'mfl', 'mimelite', 'mimexlite'},
      'server_adaptive_lr': {'nastya'}, 'client_lr_milestones': {'nastya', 'fedrr'},
      'token_weighting': {'fedavg'}, 'theta': {'local_update', 'local_update_decay'},
      'decay_reference_semantics': local_update,
      **{flag: {'local_update_decay'} for flag in (
          'decay_min_delta', 'client_lr_decay_factor', 'server_lr_decay_factor',
          'decay_patience', 'decay_window', 'decay_cooldown')}}
  for flag, users in expected.items():
    assert set(algorithm_flags.readers(flag)) == users, flag
  # Plain SGD: the algorithms without a client optimiser.
  assert set(algorithm_flags.readers('client_optimizer')) == {
      'fedavg', 'fedprox', 'fedmax', 'fedgbo', 'mfl', 'mimelite', 'mimexlite'}
  assert 'fedsgd' not in algorithm_flags.readers('client_learning_rate')


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
    ('--algorithm=fedsplit --server_learning_rate=0.5', 'fedsplit has no server step'),
    # Flags that would be dropped without a word.
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
  zero = HParams(client_learning_rate=0.0)
  unset = set(algorithm_flags.SPECS) - {'client_learning_rate'}  # as the trainer's
  for name in ('fedavg', 'feddyn', 'fedprox', 'mfl'):
    (warning,) = algorithm_flags.warnings(name, zero, unset)
    assert warning.startswith(f'--client_learning_rate=0: {name} clients do not move')
    assert algorithm_flags.warnings(name, HParams(), unset) == []
  for name in ('local_update', 'reptile', 'fomaml', 'kmaml', 'minibatch_sgd',
               'local_update_decay'):
    assert algorithm_flags.warnings(name, zero, unset) == []
  for name in ('scaffold', 'fedgbo'):  # their rules divide by gamma: refused
    with pytest.raises(ValueError, match='> 0'):
      algorithm_flags.config(name, zero, unset)


def test_a_zero_server_learning_rate_is_a_warning_but_as_an_adaptive_start():
  zero = HParams(server_learning_rate=0.0)
  for name in ('fedavg', 'reptile', 'nastya'):
    (warning,) = algorithm_flags.warnings(name, zero)
    assert warning.startswith(f'--server_learning_rate=0: the {name} server never moves')
  with pytest.raises(ValueError, match='adaptive server step needs an initial eta_0 > 0'):
    algorithm_flags.warnings('nastya', HParams(server_learning_rate=0.0,
                                               server_adaptive_lr=True))
  assert algorithm_flags.warnings('nastya', HParams(server_learning_rate=0.5,
                                                    server_adaptive_lr=True)) == []


def test_the_local_update_flags_are_accepted_where_they_are_read():
  """--theta and the plateau flags pass every check where they are read (the
  refusals elsewhere: `test_bad_algorithm_flags_are_answered_without_tensorflow`)."""
  algorithm_flags.check('local_update', HParams(theta='1,0,0.5'))
  algorithm_flags.check('local_update_decay', HParams(theta='fomaml', decay_patience=5,
                                                decay_reference_semantics=True))
  algorithm_flags.check('kmaml', HParams(decay_reference_semantics=True))


def test_grids_drop_uniform_weighting_for_the_equal_weighted_algorithms():
  """The trainer refuses --uniform_weighting for FedDyn/SCAFFOLD (their means
  are equal-weighted already); a grid's FedAvg beside them takes it (fedgbo
  sets it for every run, paper 003's page gives it for FedAvg/FedProx), so the
  grid drops it for those two with a note instead of refusing the grid."""
  hp = HParams(uniform_weighting=True)
  assert algorithm_flags.for_algorithm('feddyn', hp).uniform_weighting is False
  assert algorithm_flags.for_algorithm('scaffold', hp).uniform_weighting is False
  assert algorithm_flags.for_algorithm('fedavg', hp).uniform_weighting is True
  algorithm_flags.check('scaffold', algorithm_flags.for_algorithm('scaffold', hp))  # not refused
  with pytest.raises(ValueError, match='scaffold does not use --uniform_weighting'):
    algorithm_flags.check('scaffold', hp)
  assert algorithm_flags.ignored_flags(['fedavg', 'feddyn', 'scaffold'], hp) == {
      'uniform_weighting': ['feddyn', 'scaffold']}


def test_configs_of_one_class_are_told_apart_by_their_fixed_fields():
  hp = HParams(local_steps=3)
  assert algorithm_flags.config('reptile', hp).theta_weights().tolist() == [1.0, 1.0, 1.0]
  assert algorithm_flags.config('fomaml', hp).theta_weights().tolist() == [0.0, 0.0, 1.0]
  assert algorithm_flags.config('mimexlite', hp, {'client_optimizer'}).gradient == 'one_batch'
  assert algorithm_flags.config('fedavg', HParams()) == registry.get('fedavg').default_config()


def test_unset_flags_take_the_algorithms_own_defaults_and_k_yields_to_epochs():
  unset = set(algorithm_flags.SPECS)
  gbo = algorithm_flags.config('fedgbo', HParams(), unset)
  assert (gbo.client_optimizer, gbo.local_steps) == ('sgdm', 10)
  epochs = algorithm_flags.config('mfl', HParams(client_epochs_per_round=2),
                                  unset - {'client_epochs_per_round'})
  assert (epochs.local_steps, epochs.client_epochs_per_round) == (None, 2)
  hp = algorithm_flags.with_defaults('mimelite', HParams(), unset)
  assert (hp.client_optimizer, hp.local_steps) == ('sgdm', 10)


def test_a_flag_that_is_not_finite_is_refused_whatever_its_range():
  with pytest.raises(ValueError, match=r'--prox_mu must be a finite number >= 0, got inf'):
    algorithm_flags.check('fedprox', HParams(prox_mu=float('inf')))
  with pytest.raises(ValueError, match=r'--client_learning_rate must be a finite number'):
    algorithm_flags.check('fedavg', HParams(client_learning_rate=float('nan')))
