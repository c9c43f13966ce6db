"""Algorithm registry: names, and flags that only some algorithms read."""

import dataclasses

import pytest

from tff_algos import registry
from tff_algos.hparams import HParams


def test_every_algorithm_of_the_issues_is_registered():
  assert {'fedavg', 'fedsgd', 'local_update', 'local_update_decay', 'reptile', 'fomaml',
          'kmaml', 'minibatch_sgd', 'nastya', 'fedrr', 'feddyn', 'scaffold', 'fedprox',
          'fedgbo', 'mfl', 'mimelite', 'mimexlite', 'fedmax'} <= set(registry.ALGORITHMS)
  with pytest.raises(ValueError, match='unknown algorithm'):
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
  from experiments import flags as trainer_flags
  from tasks import list_tasks
  from tff_algos import registry
  assert sorted(trainer_flags.TASK_NAMES) == sorted(list_tasks())
  assert sorted(trainer_flags.ALGORITHM_NAMES) == sorted(registry.ALGORITHMS)
