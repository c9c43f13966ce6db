"""Several rounds per TFF call (`training.chain`, `RunConfig.rounds_per_call`):
the same models and metrics as one round per call, bit for bit."""

import csv
import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

import processes
from tff_algos.algorithms import feddyn, fedopt, local_update
from tff_algos.training import chain
from tff_algos import training


@pytest.fixture(scope='module')
def task():
  return processes.digits_task()


@pytest.fixture(scope='module')
def fedavg(task):
  return processes.fedavg_with_schedule(task)


@pytest.fixture(params=['cpp', 'inprocess'])
def backend(request):
  """The session's context (TFF's C++ worker, tests/conftest.py) or the
  binaries' default in-process backend, whose whole-call tracer turns a chain
  into one traced TensorFlow call."""
  if request.param == 'cpp':
    yield request.param
    return
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tff_algos.runtime import inprocess
  with context_stack_impl.context_stack.install(inprocess.create_context()):
    yield request.param


def _bits(structure):
  return [np.asarray(x).tobytes() for x in tf.nest.flatten(structure)]


def _decay(task):
  return local_update.build_local_update_decay(task.model_fn, local_update.LocalUpdateDecayConfig(theta=(1.0, 1.0), client_learning_rate=0.05, decay_window=2, decay_patience=1, decay_cooldown=0, decay_min_delta=10.0))


@pytest.mark.parametrize('build', ['fedavg', 'local_update_decay'])
def test_chained_rounds_equal_one_call_per_round(task, fedavg, build, backend):
  """FedAvg with an Adam server and a K schedule; LocalUpdateDecay, whose
  plateau state sets both learning rates inside the round."""
  process = (fedavg if build == 'fedavg' else _decay(task)).process
  ids = task.client_ids
  rounds = [[task.client_dataset(ids[(5 * r + j) % len(ids)]) for j in range(3)]
            for r in range(6)]
  state, metrics = process.initialize(), []
  for data in rounds:
    output = process.next(state, data)
    state = output.state
    metrics.append(output.metrics)
  chained, chained_metrics = process.initialize(), []
  for first, n in ((0, 4), (4, 2)):
    chained, more = chain.chained_next(process, n)(chained, rounds[first:first + n])
    chained_metrics.extend(more)
  assert _bits(chained) == _bits(state)
  assert _bits(chained_metrics) == _bits(metrics)
  assert type(chained) is type(state) and type(chained_metrics[0]) is type(metrics[0])
  assert chain.chained_next(process, 4) is chain.chained_next(process, 4)  # built once


def test_a_process_no_longer_used_drops_its_chains(task):
  import gc
  import weakref
  process = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(local_steps=1)).process
  chain.chained_next(process, 2)
  ref = weakref.ref(process)
  del process
  gc.collect()
  assert ref() is None


def test_only_processes_of_state_and_client_data_chain(task):
  algorithm = feddyn.build_feddyn(task.model_fn, feddyn.FedDynConfig(local_steps=2))
  assert not chain.can_chain(algorithm.process)
  with pytest.raises(ValueError, match='several rounds per call'):
    chain.chained_next(algorithm.process, 2)


def _config(out_dir, per_call, total=23):
  return training.RunConfig(total_rounds=total, clients_per_round=4, seed=3,
                            rounds_per_eval=5, rounds_per_checkpoint=4, output_dir=out_dir,
                            progress=False, rounds_per_call=per_call)


def _rows(out_dir):
  with open(os.path.join(out_dir, 'metrics.csv')) as f:
    return [{k: v for k, v in row.items() if k != 'round_time_s'} for row in csv.DictReader(f)]


def test_run_with_rounds_per_call_equals_one_round_per_call(task, fedavg, tmp_path,
                                                            monkeypatch, backend):
  one = training.run_training(fedavg, task, _config(str(tmp_path / 'one'), 1))
  lengths = []
  real = chain.chained_next

  def recording(process, n):
    lengths.append(n)
    return real(process, n)
  monkeypatch.setattr(training.chain, 'chained_next', recording)
  many = training.run_training(fedavg, task, _config(str(tmp_path / 'many'), 7))
  # Calls end at evaluations (every 5), checkpoints (every 4) and the end (23):
  # rounds 1-4, 5, 6-8, 9-10, 11-12, 13-15, 16, 17-20, 21-23 (one-round calls
  # are plain `next` calls).
  assert lengths == [4, 3, 2, 2, 3, 4, 3]
  assert _bits(many.model_weights) == _bits(one.model_weights)
  assert _rows(str(tmp_path / 'many')) == _rows(str(tmp_path / 'one'))
  assert [r['round'] for r in many.history if 'eval/loss' in r] == [5, 10, 15, 20, 23]
  assert many.final_eval == one.final_eval
  times = [r['round_time_s'] for r in many.history]
  assert times[5] == times[6] == times[7] > 0  # rounds 6-8: one call's time over 3
  # Without an output directory nothing is saved, so calls end only at
  # evaluations and the end.
  lengths.clear()
  unsaved = training.run_training(fedavg, task, _config(None, 7))
  assert lengths == [5, 5, 5, 5, 3]
  assert _bits(unsaved.model_weights) == _bits(one.model_weights)


def test_resume_with_rounds_per_call_continues_the_same_run(task, fedavg, tmp_path):
  full = training.run_training(fedavg, task, _config(str(tmp_path / 'full'), 1))
  out = str(tmp_path / 'resumed')
  training.run_training(fedavg, task, _config(out, 7, total=12))
  resumed = training.run_training(fedavg, task, _config(out, 10))
  assert resumed.resumed_from == 12
  assert _bits(resumed.model_weights) == _bits(full.model_weights)
  # Round 12 ended the first part, so it carries an evaluation the full run lacks.
  def training_columns(rows):
    return [{k: v for k, v in r.items() if not k.startswith('eval/')} for r in rows]
  assert training_columns(_rows(out)) == training_columns(_rows(str(tmp_path / 'full')))


def test_clients_with_states_run_one_round_per_call(task, tmp_path, capsys):
  algorithm = feddyn.build_feddyn(task.model_fn, feddyn.FedDynConfig(local_steps=2))
  one = training.run_training(algorithm, task, _config(None, 1, total=6))
  capsys.readouterr()
  many = training.run_training(algorithm, task, _config(None, 5, total=6))
  assert "rounds_per_call=5 runs one round per call here: feddyn's clients keep states" in (
      capsys.readouterr().err)
  assert _bits(many.model_weights) == _bits(one.model_weights)


def test_bernoulli_participation_runs_one_round_per_call(task, fedavg, capsys):
  """Cohorts of several sizes are not one CLIENTS placement."""
  def config(per_call):
    return dataclasses.replace(_config(None, per_call, total=6), participation_prob=0.4)
  one = training.run_training(fedavg, task, config(1))
  capsys.readouterr()
  many = training.run_training(fedavg, task, config(3))
  assert ('rounds_per_call=3 runs one round per call here: participation_prob draws '
          'cohorts of several sizes') in capsys.readouterr().err
  assert len({r['client_work/train/num_examples'] for r in one.history}) > 1
  assert _bits(many.model_weights) == _bits(one.model_weights)


def test_rounds_per_call_below_one_is_refused():
  with pytest.raises(ValueError, match='rounds_per_call must be >= 1'):
    training.RunConfig(total_rounds=3, clients_per_round=2, rounds_per_call=0)


@pytest.mark.parametrize('backend', ['cpp', 'host_datasets'])
def test_chained_rounds_run_on_the_cpp_worker_and_the_gpu_path(task, fedavg, backend):
  """TFF's C++ worker; the in-process path of GPU machines (datasets kept on
  the host, calls interpreted one by one), here on the CPU."""
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tff_algos import runtime
  from tff_algos.runtime import inprocess
  process = fedavg.process
  rounds = [[task.client_dataset(task.client_ids[(3 * r + j) % 12]) for j in range(3)]
            for r in range(3)]
  context = runtime.ManagedContext(backend='cpp') if backend == 'cpp' else None
  try:
    with context_stack_impl.context_stack.install(
        context.context if context else inprocess.create_context(host_datasets=True)):
      state = process.initialize()
      for data in rounds:
        state = process.next(state, data).state
      chained, _ = chain.chained_next(process, 3)(process.initialize(), rounds)
  finally:
    if context:
      context.close()
  assert _bits(chained) == _bits(state)


def test_several_workers_run_one_round_per_call(task, fedavg, capsys):
  """TFF's multi-worker context merges one aggregation per call."""
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tff_algos import runtime
  one = training.run_training(fedavg, task, _config(None, 1, total=4))
  capsys.readouterr()
  context = runtime.ManagedContext(workers=2)
  try:
    with context_stack_impl.context_stack.install(context.context):
      assert not chain.context_runs_chains()
      two = training.run_training(fedavg, task, _config(None, 3, total=4))
  finally:
    context.close()
  assert chain.context_runs_chains()
  assert ('rounds_per_call=3 runs one round per call here: several workers merge one '
          'aggregation per call') in capsys.readouterr().err
  for x, y in zip(tf.nest.flatten(two.model_weights), tf.nest.flatten(one.model_weights)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)
