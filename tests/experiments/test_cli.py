"""The trainer binary end to end: flags, outputs, signals, kill-and-resume."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from conftest import wait_dead, worker_pids_of
from paths import ROOT
from tff_algos.training import crash_points

BASE = ['--task=digits', '--model=logistic', '--clients_per_round=5',
        '--client_batch_size=16', '--local_steps=3', '--rounds_per_eval=4',
        '--rounds_per_checkpoint=2', '--noprogress']


def train_cmd(out, name, rounds, *extra):
  return [sys.executable, '-m', 'experiments.train', *BASE, f'--root_output_dir={out}',
          f'--experiment_name={name}', f'--total_rounds={rounds}', *extra]


def run(cmd, timeout=300):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)


BAD_FLAGS = [
    ('--clients_per_round=31', 'exceeds the 30 clients of task'),  # before the data loads
    ('--num_clients=5 --clients_per_round=6', 'exceeds the 5 clients'),
    ('--task=synthetic_logistic --clients_per_round=21', 'exceeds the 20 clients'),
    ('--total_rounds=-3', 'total_rounds must be >= 1'),
    ('--clients_per_round=0', 'clients_per_round must be >= 1'),
    ('--local_steps=5 --local_steps_decay=1.5', '--local_steps_decay must be in (0, 1]'),
    ('--local_steps_decay=0.9', 'local_steps_decay needs local_steps'),
    ('--client_learning_rate=-0.1', '--client_learning_rate must be >= 0'),
    # TFF's builders refused these with a traceback after TensorFlow loaded (or,
    # inf and a beta of 1, not at all).
    ('--client_learning_rate=inf', '--client_learning_rate must be a finite number >= 0'),
    ('--server_optimizer=adam --server_beta_1=1.5',
     '--server_beta_1 must be in [0, 1) with --server_optimizer=adam, got 1.5'),
    ('--server_optimizer=adam --server_beta_2=1', '--server_beta_2 must be in [0, 1)'),
    ('--server_optimizer=sgdm --server_momentum=-0.5', '--server_momentum must be in [0, 1)'),
    ('--server_optimizer=adagrad --server_epsilon=-1',
     '--server_epsilon must be a finite number >= 0 with --server_optimizer=adagrad'),
    ('--server_optimizer=yogi --server_initial_accumulator=-1',
     '--server_initial_accumulator must be a finite number >= 0'),
    ('--client_optimizer=adam --client_beta_1=nan', '--client_beta_1 must be in [0, 1)'),
    ('--model=resnet', "task 'digits' has no model 'resnet'"),
    ('--experiment_name=a/b', '--experiment_name must be'),
    ('--seed=-1', 'seed must be >= 0'),
    ('--rounds_per_call=0', 'rounds_per_call must be >= 1'),
    ('--algorithm=fedsgd --server_lr_decay=2', '--server_lr_decay must be in (0, 1]'),
    ('--algorithm=reptile --local_steps=0', '--local_steps must be >= 1'),
    ('--algorithm=scaffold --local_steps=-2', '--local_steps must be >= 1'),
    ('--client_epochs_per_round=0', '--client_epochs_per_round must be >= 1'),
    ('--local_steps=5 --client_epochs_per_round=3',
     '--local_steps (K) and --client_epochs_per_round both set'),
    ('--algorithm=fedsgd --local_steps=5', 'fedsgd does not use --local_steps'),
    ('--algorithm=kmaml --client_optimizer=adam', 'does not use --client_optimizer'),
    ('--algorithm=local_update --server_lr_decay=0.9', 'does not use --server_lr_decay'),
    ('--algorithm=local_update_decay --client_lr_decay_factor=0',
     '--client_lr_decay_factor must be in (0, 1]'),
    ('--algorithm=local_update_decay --decay_window=0', '--decay_window must be >= 1'),
    # Their means are equal-weighted already: the flag changed nothing, silently.
    ('--algorithm=feddyn --uniform_weighting', 'feddyn does not use --uniform_weighting'),
    ('--algorithm=scaffold --uniform_weighting', 'scaffold does not use --uniform_weighting'),
    ('--algorithm=local_update_decay --decay_min_delta=-1', '--decay_min_delta must be >= 0'),
    # digits splits by Dirichlet label skew whatever --partition says, and
    # --token_weighting on a task without token sequences weighted each client
    # by its labels that are not 0: both ran without a word.
    ('--partition=iid', "--partition: task 'digits' does not use it (its split reads only "
                        '--dirichlet_alpha'),
    ('--partition=sorted --unbalanced_sigma=0.3',
     "--partition, --unbalanced_sigma: task 'digits' does not use them"),
    ('--task=emnist_character --dirichlet_alpha=0.1',
     "--dirichlet_alpha: task 'emnist_character' does not use it (its clients are fixed"),
    ('--task=shakespeare_003 --dirichlet_alpha=0.1', "task 'shakespeare_003' does not use"),
    ('--token_weighting', "--token_weighting: task 'digits' has no padded token sequences"),
    ('--task=emnist_character --token_weighting',
     'the tasks that have them: shakespeare_character, stackoverflow_word'),
]


@pytest.mark.parametrize('flag,message', BAD_FLAGS)
def test_flag_validation_messages(flag, message):
  from absl import flags
  from experiments.lib import flags as trainer_flags
  import experiments.train  # noqa: F401  (defines the binary's own flags)
  FLAGS = flags.FLAGS
  FLAGS.unparse_flags()
  try:
    FLAGS(['train', *flag.split()])
    with pytest.raises(trainer_flags.FlagError, match=re.escape(message)):
      trainer_flags.validate()
  finally:
    FLAGS.unparse_flags()


@pytest.mark.parametrize('flag,message', [
    ('--task=nope', 'flag --task=nope: value should be one of <cifar10|'),
    ('--algorithm=fedfoo', 'flag --algorithm=fedfoo: value should be one of <fedavg|'),
    ('--total_rounds=-3', 'total_rounds must be >= 1'),
    ('--clients_per_round=31', 'exceeds the 30 clients'),
])
def test_bad_flags_exit_2_before_any_worker_starts(tmp_path, flag, message):
  res = run([sys.executable, '-m', 'experiments.train', f'--root_output_dir={tmp_path}',
             '--noprogress', flag])
  assert res.returncode == 2, res.stderr[-2000:]
  assert f'error: ' in res.stderr and message in res.stderr
  assert os.listdir(tmp_path) == []  # nothing written, no run started


def test_missing_dataset_names_the_file(tmp_path):
  res = run([sys.executable, '-m', 'experiments.train', '--task=emnist_character',
             f'--cache_dir={tmp_path}', f'--root_output_dir={tmp_path}', '--noprogress'])
  assert res.returncode != 0
  assert 'emnist_all.sqlite' in res.stderr and str(tmp_path) in res.stderr


def _wait_stopped(proc, timeout=240):
  """Waits until `proc` has stopped itself (`crash_points` ...:stop)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise AssertionError(f'run ended early: {proc.stderr.read()[-3000:]}')
    if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
      return
    time.sleep(0.05)
  raise AssertionError('no progress')


ROUNDS = 10


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  out = tmp_path_factory.mktemp('runs')
  full = run(train_cmd(out, 'full', ROUNDS))
  assert full.returncode == 0, full.stderr[-3000:]
  assert 'final eval' in full.stdout and 'sparse_categorical_accuracy' in full.stdout
  assert os.path.exists(out / 'full' / 'curves.png')
  return out / 'full'


# Killed on the C++ worker (which must die with the run) or in-process; resumed
# on the default (in-process) backend: runs resume across backends.
@pytest.mark.parametrize('sig,backend', [
    pytest.param(signal.SIGTERM, 'cpp', marks=pytest.mark.slow), (signal.SIGINT, 'cpp'),
    (signal.SIGTERM, 'inprocess')])
def test_killed_run_leaves_no_worker_and_resumes_to_the_same_model(
    tmp_path, sig, backend, uninterrupted):
  rounds = ROUNDS

  # The run holds itself after its 5th metrics row (written in a batch with
  # others, maybe) and the signal lands there. Polling metrics.csv instead
  # raced a fast in-process run to its end (seen once).
  env = dict(os.environ, PYTHONPATH=ROOT, **{crash_points.ENV: 'metrics_row:5:stop'})
  proc = subprocess.Popen(train_cmd(tmp_path, 'killed', rounds, f'--backend={backend}'),
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  _wait_stopped(proc)
  with open(tmp_path / 'killed' / 'metrics.csv') as f:
    assert sum(1 for _ in f) - 1 >= 5
  workers = worker_pids_of(proc.pid)
  if backend == 'cpp':
    assert workers, 'the run should be using a worker'
  else:
    assert workers == []
  proc.send_signal(sig)
  proc.send_signal(signal.SIGCONT)
  proc.communicate(timeout=60)
  assert proc.returncode != 0
  assert wait_dead(workers) == []
  assert not os.path.exists(tmp_path / 'killed' / 'final_weights.npz')

  resumed = run(train_cmd(tmp_path, 'killed', rounds))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  a = np.load(uninterrupted / 'final_weights.npz')
  b = np.load(tmp_path / 'killed' / 'final_weights.npz')
  assert a.files == b.files
  for k in a.files:
    if backend == 'inprocess':  # one backend throughout: bit-identical
      np.testing.assert_array_equal(a[k], b[k])
    else:  # rounds 1-4 on the C++ worker's TensorFlow build
      np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6)
  with open(tmp_path / 'killed' / 'metrics.csv') as f:
    assert sum(1 for _ in f) - 1 == rounds


def test_the_resume_line_comes_before_the_progress_bar(tmp_path):
  """Printed after the bar was drawn, 'resuming from round N' landed on the
  bar's line in a terminal; one stream (as a terminal shows both) keeps the order."""
  first = run(train_cmd(tmp_path, 'r', 2))
  assert first.returncode == 0, first.stderr[-2000:]
  cmd = [a for a in train_cmd(tmp_path, 'r', 4) if a != '--noprogress'] + ['--progress']
  res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
  assert res.returncode == 0, res.stdout[-2000:]
  resumed, bar = res.stdout.find('resuming from round 2'), res.stdout.find('fedavg:')
  assert 0 <= resumed < bar, res.stdout[-2000:]


def test_split_flags_pass_where_the_task_reads_them():
  from tasks import catalog
  tasks = {t.name: t for t in catalog.TASKS}
  given = {'partition', 'dirichlet_alpha', 'unbalanced_sigma'}
  values = dict(partition='dirichlet', dirichlet_alpha=0.3, unbalanced_sigma=0.3)
  assert tasks['feddyn_digits'].unread_splits(given, values) == []
  assert tasks['logistic'].unread_splits(given, values) == ['unbalanced_sigma']
  # A grid's sigma of 0 is what every task has: not refused.
  assert tasks['shakespeare_003'].unread_splits(
      {'partition', 'unbalanced_sigma'}, dict(values, unbalanced_sigma=0.0)) == []
  assert tasks['digits'].unread_splits(set(), values) == []  # nothing given
