"""One build for many runs (`registry.BuildCache`): runs whose configs differ
only in the client schedule's numbers (gamma_0, d_gamma, K_0, d_K, and eta_0,
d_eta when eta decays) share one build, the numbers read from the state; the
models are those of separate builds, bit for bit."""

import dataclasses

import numpy as np
import pytest

from tasks import get_task
from tasks.options import TaskOptions
from tff_algos.core import client_work
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams
from tff_algos import training


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(model='logistic'))


def _build(cache, name, model_fn, hp):
  """`cache.build` of the config the trainer makes from the flag values `hp`."""
  return cache.build(name, model_fn, algorithm_flags.config(name, hp))


def _train(algorithm, task, out_dir, seed=0):
  config = training.RunConfig(total_rounds=3, clients_per_round=3, rounds_per_eval=0,
                              seed=seed, progress=False, output_dir=str(out_dir))
  return [np.asarray(w) for w in
          training.run_training(algorithm, task, config).model_weights.trainable]


_FIRST = dict(client_learning_rate=0.3, local_steps=2)
_SECOND = dict(client_learning_rate=0.05, local_steps=5, local_steps_decay=0.8,
               client_lr_decay=0.9)


@pytest.mark.parametrize('name,common,second', [
    ('fedavg', {}, dict(server_learning_rate=0.5)),       # eta in TFF's finalizer state
    ('fedavg', dict(server_learning_rate=0.7, server_lr_decay=0.9),   # eta_t: the schedule's
     dict(server_learning_rate=0.4, server_lr_decay=0.8)),
    ('fedavg', dict(report_device_average=True), {}),     # a stateful process
    ('fedprox', dict(prox_mu=0.1), dict(server_optimizer='adam', server_learning_rate=0.01)),
    ('feddyn', dict(feddyn_alpha=0.05), {}),
    ('reptile', dict(local_steps=3), dict(server_learning_rate=0.5)),  # paper 002's gamma, eta
    ('nastya', {}, dict(server_learning_rate=0.5)),
    ('fedmax', dict(fedmax_beta=0.5), dict(server_learning_rate=0.5)),
    ('fedgbo', dict(client_optimizer='sgdm', client_momentum=0.9), {}),
    ('mimexlite', dict(client_optimizer='sgdm', client_momentum=0.9),
     dict(server_learning_rate=0.5)),
])
def test_a_shared_build_trains_the_models_of_a_separate_build(task, tmp_path, name, common,
                                                              second):
  if name == 'fedmax':  # needs a penultimate layer
    task = get_task('digits', TaskOptions(model='mlp'))
  cache = registry.BuildCache()
  first_hp = HParams(**dict(common, **_FIRST, **{k: v for k, v in second.items()
                                                  if k == 'server_optimizer'}))
  if name == 'reptile':  # K is Theta's length: a structure
    first_hp = dataclasses.replace(first_hp, local_steps=3)
  if name == 'nastya':  # one pass per round
    first_hp = dataclasses.replace(first_hp, local_steps=None)
  first = _build(cache, name, task.model_fn, first_hp)
  first_weights = _train(first, task, tmp_path / 'first')
  hp = HParams(**dict(common, **_SECOND, **second))
  if name == 'reptile':  # K is Theta's length: a structure
    hp = dataclasses.replace(hp, local_steps=3, local_steps_decay=1.0, client_lr_decay=1.0)
  if name == 'nastya':
    hp = dataclasses.replace(hp, local_steps=None, local_steps_decay=1.0)
  shared = _build(cache, name, task.model_fn, hp)
  assert len(cache) == 1 and shared.process is first.process
  assert shared.schedule_values is not None
  assert (shared.server_learning_rate is not None) == (
      'server_learning_rate' in second and 'server_lr_decay' not in second)
  shared_weights = _train(shared, task, tmp_path / 'shared')
  alone_weights = _train(algorithm_flags.build(name, task.model_fn, hp), task, tmp_path / 'alone')
  for s, a, f in zip(shared_weights, alone_weights, first_weights):
    np.testing.assert_array_equal(s, a)
    assert not np.array_equal(s, f)  # the numbers did change the run


def test_builds_are_shared_only_where_the_numbers_live_in_the_state(task):
  cache = registry.BuildCache()
  a = _build(cache, 'fedavg', task.model_fn, HParams(client_learning_rate=0.1))
  assert _build(cache, 'fedavg', task.model_fn,
                     HParams(client_learning_rate=0.3)).process is a.process
  assert _build(cache, 'fedavg', task.model_fn, HParams(
      client_momentum=0.9, client_optimizer='sgdm')).process is not a.process
  assert len(cache) == 2
  # SCAFFOLD's reference conventions read gamma from its config: not shared.
  _build(cache, 'scaffold', task.model_fn, HParams(client_learning_rate=0.1))
  _build(cache, 'scaffold', task.model_fn, HParams(client_learning_rate=0.2))
  assert len(cache) == 4
  # Another task object (model_fn) is another build.
  other = get_task('digits', TaskOptions(model='logistic'))
  _build(cache, 'fedavg', other.model_fn, HParams(client_learning_rate=0.1))
  assert len(cache) == 5
  # At most MAX_BUILDS are kept, the least recently used dropped first.
  cache.MAX_BUILDS = 5
  assert cache.made == 5
  assert _build(cache, 'fedavg', task.model_fn, HParams()).process is a.process  # now recent
  assert cache.made == 5  # reused
  _build(cache, 'fedavg', task.model_fn, HParams(server_optimizer='adam'))
  assert len(cache) == 5 and cache.made == 6  # a new build, though the length stays
  assert _build(cache, 'fedavg', task.model_fn, HParams()).process is a.process


def test_schedule_values_must_fit_the_build():
  schedule = client_work.client_schedule(0.1, 1.0, 3, 1.0, 1)
  state = {'client_work': collections_state(schedule)}
  epochs = client_work.client_schedule(0.1, 1.0, None, 1.0, 1).state_values()
  with pytest.raises(ValueError, match='do not fit'):
    client_work.set_schedule_values(state, epochs)
  with pytest.raises(ValueError, match='no schedule values'):
    client_work.set_schedule_values({'round_num': 0}, schedule.state_values())
  new = client_work.set_schedule_values(
      state, client_work.client_schedule(0.5, 0.9, 7, 0.8, 1).state_values())
  assert dict(new['client_work']['values']) == dict(
      learning_rate=0.5, learning_rate_decay=0.9, local_steps=7.0, local_steps_decay=0.8)
  assert new['client_work']['round_num'] == 0


def collections_state(schedule):
  state = schedule.initial_state()
  return {k: (v.numpy() if hasattr(v, 'numpy') else
              {n: t.numpy() for n, t in v.items()}) for k, v in state.items()}
