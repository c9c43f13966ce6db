"""experiments.fedgbo (paper 004 tables): cost-to-target tables, Sent140
loading and its error, and a smoke run of the binary on the digits task."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from binaries import assert_refused, run_binary
from experiments import report
from paths import ROOT
from tasks import sent140

ACC = 'eval/sparse_categorical_accuracy'


def rows_of(accuracies, upload=10.0, flops=100.0):
  """One row per round; accuracy evaluated where not None."""
  rows = []
  for r, acc in enumerate(accuracies, start=1):
    row = {'round': float(r), 'upload_bytes': upload, 'download_bytes': 2 * upload,
           'client_flops': flops}
    if acc is not None:
      row[ACC] = acc
    rows.append(row)
  return rows


def test_cost_to_reach_sums_costs_up_to_the_first_round_at_target():
  rows = rows_of([None, 0.3, None, 0.5, None, 0.45])
  hit = report.cost_to_reach(rows, 0.5)
  assert hit == dict(reached=True, round=4, upload_bytes=40.0, download_bytes=80.0,
                     client_flops=400.0)
  assert report.cost_to_reach(rows, 0.3, costs=('client_flops',)) == dict(
      reached=True, round=2, client_flops=200.0)
  miss = report.cost_to_reach(rows, 0.9)
  assert not miss['reached'] and miss['round'] is None and miss['upload_bytes'] == 60.0
  assert report.best_metric(rows) == (0.5, 4)


def test_cost_table_is_table_iv():
  runs = {'fedavg': rows_of([0.2, 0.4, 0.5, 0.5]),
          'fast': rows_of([0.5, 0.6, 0.55, 0.55], upload=20.0, flops=1e12),
          'slow': rows_of([0.1, 0.2, 0.3, 0.4])}
  header, table = report.cost_table(runs)
  assert header[:5] == ['algorithm', 'max_acc_%', 'round', 'upload_GB', 'TFLOPs']
  by = {row[0]: row for row in table}
  assert by['fedavg'][1:5] == [50.0, 3, 30 / 1e9, 300 / 1e12]
  assert by['fedavg'][5:] == ['-'] * 3            # the baseline itself
  assert by['fast'][1:5] == [60.0, 2, 40 / 1e9, 2.0]
  assert by['fast'][5:] == [1, 20 / 1e9, 1.0]      # reaches fedavg's 0.5 at round 1
  assert by['slow'][5:] == ['-'] * 3               # never reaches 0.5
  md = report.markdown_table(header, table)
  assert md.splitlines()[0].startswith('| algorithm | max_acc_%')


def write_leaf(directory, split, users):
  os.makedirs(os.path.join(directory, split), exist_ok=True)
  blob = {'users': list(users), 'num_samples': [len(v[1]) for v in users.values()],
          'user_data': {u: {'x': [[0, 'date', 'NO_QUERY', u, t] for t in texts], 'y': labels}
                        for u, (texts, labels) in users.items()}}
  with open(os.path.join(directory, split, 'all_data_niid.json'), 'w') as f:
    json.dump(blob, f)


def test_sent140_files_missing_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match='needs --sent140_dir'):
    sent140.files(None)
  with pytest.raises(ValueError, match=r'has no train/\*\.json.*preprocess\.sh'):
    sent140.files(str(tmp_path))
  write_leaf(str(tmp_path), 'train', {'a': (['hi'], [1])})
  with pytest.raises(ValueError, match=r'has no test/\*\.json'):
    sent140.files(str(tmp_path))


def test_sent140_bag_of_words_task(tmp_path):
  d = str(tmp_path)
  write_leaf(d, 'train', {'u1': (['Good day good', 'bad day', '!!!'], [1, 0, 1]),
                          'u2': (['great day', 'awful'], [1, 0])})
  write_leaf(d, 'test', {'u1': (['good'], [1]), 'u2': (['unknownword'], [0])})
  task = sent140.build(d, batch_size=8, vocab_size=3)   # day, good, bad|great|awful
  assert len(task.client_ids) == 2
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  x, y = batch['x'].numpy(), batch['y'].numpy()
  assert x.shape == (2, 3)                 # '!!!' has no known token: dropped
  np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-6)
  assert list(y) == [1, 0]
  assert task.info['vocab_size'] == 3
  test = next(iter(task.test_data))
  assert test['x'].shape == (1, 3)         # the unknown-word test sample is dropped
  assert task.model_fn().trainable_variables[0].shape == (3, 2)


def run_fedgbo(*args, timeout=900):
  return subprocess.run([sys.executable, '-m', 'experiments.fedgbo', *args, '--noprogress'],
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                        capture_output=True, text=True, timeout=timeout)


def test_binary_refuses_sent140_without_its_files(tmp_path):
  res = run_fedgbo('--tasks=sent140', f'--sent140_dir={tmp_path}', '--algorithms=fedavg')
  assert res.returncode == 2
  assert 'train/*.json' in res.stderr and 'preprocess.sh' in res.stderr


def test_sent140s_placeholder_task_does_not_cap_its_cohort(tmp_path):
  """The Sent140 preset names --task=digits only as a stand-in for its own
  loader: a cohort above digits' 30 clients is not refused for it (the run
  takes the data's clients, here 2)."""
  d = str(tmp_path / 'leaf')
  write_leaf(d, 'train', {'u1': (['good day', 'bad day'], [1, 0]),
                          'u2': (['great day', 'awful'], [1, 0])})
  write_leaf(d, 'test', {'u1': (['good'], [1]), 'u2': (['bad'], [0])})
  res = run_fedgbo('--tasks=sent140', f'--sent140_dir={d}', '--algorithms=fedavg', '--ks=1',
                   '--clients_per_round=40', '--total_rounds=1', '--rounds_per_eval=1',
                   f'--root_output_dir={tmp_path}')
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'exceeds' not in res.stderr


# All seven algorithms of paper 004's Table IV.
SMOKE_ALGORITHMS = 'fedavg,fedgbo,mfl,mimelite,mimexlite,fedmax,fedprox'


@pytest.mark.slow
def test_smoke_run_writes_tables_and_plots(tmp_path):
  res = run_fedgbo('--tasks=digits', '--ks=2', f'--algorithms={SMOKE_ALGORITHMS}',
                   '--total_rounds=3', '--rounds_per_eval=1', f'--root_output_dir={tmp_path}',
                   '--algorithm_flags=fedmax:fedmax_beta=0.5')
  assert res.returncode == 0, res.stderr[-3000:]
  summary = json.loads(res.stdout.strip().splitlines()[-1])
  algorithms = SMOKE_ALGORITHMS.split(',')
  assert set(summary['max_accuracy_%']['digits/K2']) == set(algorithms)
  root = tmp_path / 'fedgbo'
  with open(root / 'table4.csv') as f:
    table = list(csv.DictReader(f))
  assert [r['algorithm'] for r in table] == algorithms
  tables = (root / 'tables.md').read_text()
  assert 'Table IV: digits, K = 2' in tables and 'Table V' in tables
  assert os.path.exists(root / 'digits_K2_costs.png')
  # Cost columns of every run; Mimelite's full-batch gradient costs FLOPs
  # that MimeXlite's one minibatch does not, FedGBO uploads less than MFL.
  totals = {}
  for name in algorithms:
    with open(root / 'digits' / 'K2' / name / 'summary.json') as f:
      totals[name] = json.load(f)['totals']
    assert totals[name]['client_flops'] > 0 and totals[name]['upload_bytes'] > 0
  assert totals['mimelite']['client_flops'] > totals['mimexlite']['client_flops']
  assert totals['fedgbo']['upload_bytes'] < totals['mfl']['upload_bytes']
  # The preset's client optimiser for the adaptive algorithms is SGDm.
  with open(root / 'digits' / 'K2' / 'fedgbo' / 'summary.json') as f:
    flags = json.load(f)['flags']
  assert flags['client_optimizer'] == 'sgdm' and flags['client_momentum'] == 0.9
  # Every method: K steps and Algorithm 1's plain mean 1/M.
  for name in algorithms:
    with open(root / 'digits' / 'K2' / name / 'summary.json') as f:
      flags = json.load(f)['flags']
    assert flags['local_steps'] == 2 and flags['uniform_weighting'] is True, name


def test_the_docstrings_adam_override_drops_the_sgdm_momentum_default():
  """`--algorithm_flags='fedgbo:client_optimizer=adam,client_beta_1=0.9'` (the
  module docstring's example): the SGDm default's momentum is not Adam's, so
  the run drops it (it was refused: '--client_momentum is for sgdm'). In a
  process of its own: the binary's flags clash with feddyn's in one process."""
  code = """
from absl import flags
from experiments import fedgbo
from experiments.lib import flags as trainer_flags
flags.FLAGS(['fedgbo'])
base = trainer_flags.TrainerArgs.from_flags()
overrides = fedgbo.parse_algorithm_flags('fedgbo:client_optimizer=adam,client_beta_1=0.9')
values = fedgbo._settings('femnist', '10', 'fedgbo', overrides, set())
_, hp, _ = fedgbo._validate('femnist', fedgbo._run_args(base, values))
print(hp.client_optimizer, hp.client_momentum, hp.client_beta_1)
"""
  root = ROOT
  res = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=root), timeout=120)
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.split() == ['adam', 'None', '0.9'], res.stdout


# One short run: a flag that the binary fails to refuse costs seconds, not the
# default grid's hours.
SMALL = ('--tasks=digits', '--ks=1', '--algorithms=fedavg', '--total_rounds=1',
         '--rounds_per_eval=1')


def _run_main(*args, cwd, timeout=300):
  return run_binary('fedgbo', *args, '--noprogress', cwd=cwd, timeout=timeout)



@pytest.mark.parametrize('flag,instead', [
    ('--experiment_name=mine', '--grid_name'), ('--algorithm=fedgbo', '--algorithms'),
    ('--local_steps=5', '--ks'), ('--task=feddyn_digits', '--tasks'),
])
def test_trainer_flags_the_binary_sets_itself_are_refused(tmp_path, flag, instead):
  """--experiment_name, --algorithm and --local_steps (--ks replaced it in
  every run) were accepted, as trainer flags, and ignored; --task replaced
  every preset's task under the preset's name."""
  res = _run_main(*SMALL, flag, f'--root_output_dir={tmp_path / "root"}', cwd=tmp_path)
  assert_refused(res, flag.split('=')[0] + ' is not read', f'use {instead}')
  assert os.listdir(tmp_path) == []


def test_a_grid_name_outside_the_root_is_refused(tmp_path):
  """--grid_name=../x wrote the grid next to --root_output_dir."""
  res = _run_main(*SMALL, '--grid_name=../x', f'--root_output_dir={tmp_path / "root"}',
                  cwd=tmp_path)
  assert_refused(res, '--grid_name must be one directory name', '../x')
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('spec,fragments', [
    ('fedmax:fedmax_beta=1', ["names 'fedmax', which is not one of --algorithms (fedavg)"]),
    ('fedavg:client_learning_rate=abc', ['fedavg:client_learning_rate=abc',
                                         'a value that --client_learning_rate takes']),
    ('fedavg:ks=3', ["unknown flag 'ks'"]),
    ('fedavg:algorithm=fedprox', ["'algorithm' is set by this binary", 'use --algorithms']),
])
def test_bad_algorithm_flags_are_refused_before_tensorflow(tmp_path, spec, fragments):
  """Flags for an algorithm not in --algorithms were ignored; a value the flag
  does not take was refused only after TensorFlow loaded, without its flag."""
  res = _run_main(*SMALL, f'--algorithm_flags={spec}', f'--root_output_dir={tmp_path / "root"}',
                  cwd=tmp_path)
  assert_refused(res, '--algorithm_flags', *fragments)
  assert os.listdir(tmp_path) == []


def test_note_select_metric_says_when_a_table_is_not_of_it():
  """Unset, the default falls back to the task's accuracy quietly (Shakespeare's
  'eval/accuracy', as documented); given, a fallback is noted; a column in no
  run (nan tables) is noted either way. In a process of its own (see below)."""
  code = """
import contextlib, io
from experiments import fedgbo
def note(used, metric, given):
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    fedgbo.note_select_metric(used, metric, given)
  return err.getvalue().splitlines()
acc = 'eval/sparse_categorical_accuracy'
shakespeare = ('shakespeare K=10', 'eval/accuracy', ['eval/accuracy', 'eval/loss'])
digits = ('digits K=10', acc, [acc, 'eval/loss'])
assert note([digits, shakespeare], acc, False) == []
assert note([digits], acc, True) == []
lines = note([digits, shakespeare], acc, True)
assert len(lines) == 1 and lines[0].startswith('note: the runs of shakespeare K=10 have no')
assert "use 'eval/accuracy' instead" in lines[0], lines
lines = note([('quad K=1', 'eval/acc', ['eval/loss'])], 'eval/acc', False)
assert len(lines) == 1 and 'their tables are nan' in lines[0] and 'eval/loss' in lines[0]
print('ok')
"""
  res = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert res.returncode == 0 and res.stdout.split() == ['ok'], res.stderr[-3000:]


@pytest.mark.slow  # grid's binary says the same note in the default suite
def test_a_select_metric_the_runs_lack_is_noted(tmp_path):
  """--select_metric=eval/acc (misspelt) quietly tabulated another column."""
  res = run_fedgbo(*SMALL, '--select_metric=eval/acc', f'--root_output_dir={tmp_path}',
                   timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  notes = [l for l in res.stderr.splitlines() if l.startswith('note:') and 'eval/acc' in l]
  assert len(notes) == 1, res.stderr[-3000:]
  assert "note: the runs of digits K=1 have no metric 'eval/acc' (--select_metric)" in notes[0]
  assert f"use '{ACC}' instead" in notes[0]
