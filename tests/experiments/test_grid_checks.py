"""The grid driver's checks: a grid over tasks trains each run on its own task,
bad --grid / --grid_name values are refused at once (before TensorFlow), and
a --select_metric the runs lack is said, not left as silent nan scores."""

import csv
import json
import os
import subprocess
import sys

import pytest

from paths import ROOT

_TINY = ['--total_rounds=2', '--rounds_per_eval=1', '--clients_per_round=3', '--noprogress']


def _run(module, *argv, timeout=300):
  return subprocess.run([sys.executable, '-m', module, *argv], cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                        text=True, timeout=timeout)


def test_a_grid_over_tasks_trains_each_run_on_its_own_task(tmp_path):
  """Loaded tasks were cached by TaskOptions alone, which does not name the
  task: `--grid=task=digits,quadratic` trained the quadratic runs on digits
  (exit 0; summary.json said digits, run_identity.json quadratic). Each run
  now has its task, equal to a trainer run of it, while runs of one task
  still share it (and so the build: the progress line says so)."""
  import numpy as np
  res = _run('experiments.grid', '--task=quadratic', *_TINY, '--grid_name=g',
             '--grid=task=digits,quadratic;client_learning_rate=0.1,0.05',
             f'--root_output_dir={tmp_path}')
  assert res.returncode == 0, res.stderr[-3000:]
  progress = [line for line in res.stdout.splitlines() if line.startswith('[')]
  assert [line.split()[1] for line in progress] == [
      f'task={t}_client_learning_rate={lr}' for t in ('digits', 'quadratic')
      for lr in ('0.1', '0.05')]
  # A task's second run reuses its first's build; quadratic's first does not.
  assert ["earlier run's build" in line for line in progress] == [False, True, False, True]
  for t in ('digits', 'quadratic'):
    for lr in ('0.1', '0.05'):
      summary = json.loads(
          (tmp_path / 'g' / f'task={t}_client_learning_rate={lr}' / 'summary.json').read_text())
      assert (summary['task'], summary['grid']) == (t, {'task': t, 'client_learning_rate': lr})
  train = _run('experiments.train', '--task=quadratic', *_TINY, '--client_learning_rate=0.1',
               f'--root_output_dir={tmp_path}', '--experiment_name=alone')
  assert train.returncode == 0, train.stderr[-3000:]
  grid = np.load(tmp_path / 'g' / 'task=quadratic_client_learning_rate=0.1' /
                 'final_weights.npz')
  alone = np.load(tmp_path / 'alone' / 'final_weights.npz')
  assert grid.files == alone.files
  for k in grid.files:
    np.testing.assert_allclose(grid[k], alone[k], rtol=0, atol=1e-6)
  # The quadratic toy has no evaluation set: its runs' nan scores are said.
  assert ("note: 2 of 4 runs (task=quadratic_client_learning_rate=0.1, "
          "task=quadratic_client_learning_rate=0.05) have no metric "
          "'eval/sparse_categorical_accuracy'") in res.stderr, res.stderr[-3000:]
  assert ('their metrics: client_work/train/loss (no eval/ metrics: no evaluation set)'
          in res.stderr), res.stderr[-3000:]


def test_parse_grid_refuses_a_repeated_axis_or_value():
  """A repeated axis replaced the earlier one (only its values ran, the column
  twice in grid.csv); a repeated value, also spelt otherwise (0.1, 0.10),
  trained the same run twice."""
  from experiments import grid
  with pytest.raises(ValueError, match=r"^--grid gives the axis 'client_learning_rate' twice"):
    grid.parse_grid('client_learning_rate=0.1;client_learning_rate=0.2')
  with pytest.raises(ValueError, match=r"^--grid axis 'seed' lists the value '0' twice"):
    grid.parse_grid('seed=0,1,0')
  with pytest.raises(ValueError, match=r"'0.1' and '0.10' are the same value"):
    grid.parse_grid('local_steps=2;client_learning_rate=0.1,0.10')
  with pytest.raises(ValueError, match=r"lists the value 'true' twice"):
    grid.parse_grid('progress=1,true')
  # Different values, and values that do not parse (said by `combinations`), pass.
  assert grid.parse_grid('client_learning_rate=0.1,0.01,x;seed=0,1') == [
      ('client_learning_rate', ['0.1', '0.01', 'x']), ('seed', ['0', '1'])]


@pytest.mark.parametrize('argv,said', [
    (['--grid_name=..'], "error: --grid_name must be one directory name of letters, digits, "
                         "_ . - (not . or ..), got '..'"),
    (['--grid_name={tmp}/elsewhere'], "error: --grid_name must be one directory name"),
    (['--grid_name=a/../..'], "error: --grid_name must be one directory name"),
    (['--grid=client_learning_rate=0.1;client_learning_rate=0.2'],
     "error: --grid gives the axis 'client_learning_rate' twice; list all its values in "
     "one group: client_learning_rate=v1,v2,..."),
    (['--grid=seed=0,0'], "error: --grid axis 'seed' lists the value '0' twice; "
                          "give each value once"),
    (['--grid=client_learning_rate=0.1,0.10'],
     "error: --grid axis 'client_learning_rate' lists the value '0.10' twice ('0.1' and "
     "'0.10' are the same value); give each value once"),
    # A bad combination after a good one: said before the good one's config check
    # loads TensorFlow (it took ~7 s).
    (['--grid=clients_per_round=3,40'], "error: --clients_per_round=40 exceeds the 30 "
                                        "clients of task 'digits'"),
])
def test_a_bad_grid_is_one_line_before_tensorflow(tmp_path, argv, said):
  """Refused with one line and exit status 2, nothing written, before
  TensorFlow is imported (grid's main imported it first, through
  `common.quiet_logs`, for every refusal). --grid_name=.. wrote the grid
  outside --root_output_dir."""
  root = tmp_path / 'root'
  argv = [a.format(tmp=tmp_path) for a in argv]  # an absolute --grid_name: still in tmp_path
  if not any(a.startswith('--grid=') for a in argv):
    argv.append('--grid=seed=0,1')
  res = subprocess.run([sys.executable, '-X', 'importtime', '-m', 'experiments.grid',
                        '--total_rounds=1', '--clients_per_round=2', '--noprogress',
                        f'--root_output_dir={root}', *argv], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=300)
  lines = [line for line in res.stderr.splitlines() if not line.startswith('import time:')]
  assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), lines[-20:]
  assert 'Traceback' not in res.stderr
  imported = [line.split('|')[-1].strip() for line in res.stderr.splitlines()
              if line.startswith('import time:')]
  assert 'tensorflow' not in imported
  assert list(tmp_path.iterdir()) == []  # nothing written, inside the root or beside it


def test_a_select_metric_the_runs_lack_is_said(tmp_path):
  """A --select_metric that no run has (misspelt here; the default on the
  quadratic toy, which has no evaluation set) gave nan scores and nothing
  else. Now one note names it and the runs' metrics; the same command with
  one of them scores the finished runs without training them again."""
  argv = ['--model=logistic', *_TINY, '--grid=seed=0,1', f'--root_output_dir={tmp_path}']
  res = _run('experiments.grid', *argv, '--select_metric=eval/accuracy')
  assert res.returncode == 0, res.stderr[-3000:]
  notes = [line for line in res.stderr.splitlines() if line.startswith('note:')]
  assert notes == [
      "note: no run has metric 'eval/accuracy' (--select_metric) in metrics.csv, so every "
      "score is nan; their metrics: eval/sparse_categorical_accuracy, eval/loss, "
      "client_work/train/sparse_categorical_accuracy, client_work/train/loss. Choose one "
      "(higher is better) with --select_metric: the same command scores the finished "
      "runs again without training them"], res.stderr[-3000:]
  with open(tmp_path / 'grid_digits' / 'grid.csv') as f:
    assert [r['score'] for r in csv.DictReader(f)] == ['nan', 'nan']
  metrics = [(tmp_path / 'grid_digits' / f'seed={s}' / 'metrics.csv').read_text()
             for s in (0, 1)]
  res = _run('experiments.grid', *argv, '--select_metric=eval/sparse_categorical_accuracy')
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'note:' not in res.stderr
  with open(tmp_path / 'grid_digits' / 'grid.csv') as f:
    assert all(0 <= float(r['score']) <= 1 for r in csv.DictReader(f))
  assert metrics == [(tmp_path / 'grid_digits' / f'seed={s}' / 'metrics.csv').read_text()
                     for s in (0, 1)]  # not trained again


def test_a_value_with_a_slash_is_one_run_directory_not_nested_ones():
  """A grid value holding '/' (a path) made <grid>/<key>=a/b, two directories,
  and a value past 255 bytes could not be a directory at all."""
  from experiments import grid
  assert grid.combination_dir({'seed': '1', 'client_learning_rate': '0.1'}) == \
      'seed=1_client_learning_rate=0.1'  # unchanged where nothing needs escaping
  assert grid.combination_dir({'data_dir': '/a/b', 'seed': '1'}) == \
      'data_dir=%2Fa%2Fb_seed=1'
  assert grid.combination_dir({'x': '50%/2'}) == 'x=50%25%2F2'
  long_a, long_b = ({'data_dir': '/d' * 200 + tail} for tail in ('a', 'b'))
  names = [grid.combination_dir(c) for c in (long_a, long_b)]
  assert all(len(n.encode()) <= 255 and '/' not in n for n in names)
  assert names[0] != names[1] and names[0][:240] == names[1][:240]


def test_a_grid_refusal_names_the_grids_own_flags(tmp_path):
  """A grid's run directory holding other settings was refused with 'choose
  another --experiment_name', a flag the grid does not read for its runs; a
  --jobs worker (here) says the same as the grid's own process."""
  argv = ['--model=logistic', *_TINY, '--grid=seed=0,1', f'--root_output_dir={tmp_path}']
  res = _run('experiments.grid', *argv)  # the runs, in this process
  assert res.returncode == 0, res.stderr[-3000:]
  res = _run('experiments.grid', *argv, '--jobs=2', '--client_learning_rate=0.05')
  assert res.returncode == 2, res.stderr[-3000:]
  line = res.stderr.strip().splitlines()[-1]
  assert ('holds a different run (differs in: client_learning_rate (the default there, '
          '0.05 here))') in line, line
  assert 'choose another --grid_name, or pass --restart to delete its outputs' in line, line


def test_flag_names_of_refusals_are_the_binarys():
  from tff_algos.training import run_dir
  saved = dict(run_dir.FLAG_NAMES)
  try:
    run_dir.set_flag_names(name='--root_output_dir', restart='--fresh')
    assert run_dir.restart_fix() == 'pass --fresh to delete its outputs and start the run over'
    with pytest.raises(ValueError, match='unknown flag roles'):
      run_dir.set_flag_names(grid='--x')
  finally:
    run_dir.FLAG_NAMES.update(saved)
  for binary, name in (('grid', '--grid_name'), ('feddyn', '--name'),
                       ('fedgbo', '--grid_name'), ('local_update_decay', '--root_output_dir')):
    source = open(os.path.join(ROOT, 'experiments', f'{binary}.py')).read()
    assert f"run_dir.set_flag_names(name='{name}'" in source, binary
