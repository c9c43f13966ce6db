"""experiments/feddyn.py: paper 003 tables (models transmitted to a target)."""

import csv
import json
import os
import subprocess
import sys

import pytest

from binaries import assert_refused, run_binary
from paths import ROOT

# The paper's four methods, all registered in tff_algos.flags.registry.
ALGORITHMS = ('feddyn', 'scaffold', 'fedavg', 'fedprox')


def _run(*args, timeout=1200):
  return subprocess.run([sys.executable, '-m', 'experiments.feddyn', *args, '--noprogress'],
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                        capture_output=True, text=True, timeout=timeout)


def test_grid_helpers_and_table_cells():
  from experiments import feddyn
  assert feddyn.parse_split('iid') == {'partition': 'iid'}
  assert feddyn.parse_split('natural') == {'partition': 'natural'}
  assert feddyn.parse_split('dirichlet:0.3') == {'partition': 'dirichlet',
                                                 'dirichlet_alpha': 0.3}
  for bad in ('sorted', 'dirichlet:0', 'dirichlet:x'):
    with pytest.raises(ValueError):
      feddyn.parse_split(bad)
  assert [feddyn.clients_per_round(p, 100) for p in (1, 0.1, 0.01, 0.001)] == [100, 10, 1, 1]
  def res(alg, seed, models, reached, final=0.9):
    return dict(setting='iid', participation=0.1, target=0.8, algorithm=alg, seed=seed,
                models_transmitted=models, reached=reached, final_value=final)
  table = feddyn.aggregate([res('feddyn', 0, 10, True), res('feddyn', 1, 20, True),
                            res('scaffold', 0, 40, True), res('scaffold', 1, 50, True),
                            res('fedavg', 0, 60, True), res('fedavg', 1, 100, False)],
                           reference='feddyn')
  row = table[('iid', 0.1, 0.8)]
  assert row['feddyn']['cell'] == '15'
  assert row['scaffold']['cell'] == '45 (3.0x)'
  assert row['fedavg']['cell'] == '80+ (>5.3x)'  # a seed missed: a lower bound
  md = feddyn.markdown(table, ['feddyn', 'scaffold', 'fedavg'], 'eval/acc')
  assert '| iid | 0.1 | 0.8 | 15 | 45 (3.0x) | 80+ (>5.3x) |' in md


def test_models_per_round_divides_by_each_rounds_own_cohort():
  """Under --participation_prob cohorts vary: round t counts its download over
  its own cohort_size (SCAFFOLD: 2 models a client whatever the cohort);
  rows written before that column fall back to clients_per_round."""
  from tff_algos.training import targets as metrics_tables
  rows = [dict(round=1, cohort_size=1, download_bytes=2 * 100.0),
          dict(round=2, cohort_size=3, download_bytes=3 * 2 * 100.0),
          dict(round=3, download_bytes=10 * 2 * 100.0)]
  assert metrics_tables.models_per_round(rows, 100.0, 10) == [2.0, 2.0, 2.0]


def test_bad_flags_fail_before_any_run(tmp_path):
  res = _run('--algorithms=fedavg,no_such_algorithm', f'--root_output_dir={tmp_path}')
  assert res.returncode == 2 and "unknown algorithm 'no_such_algorithm'" in res.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_feddyn_binary_small_grid(tmp_path):
  args = [f'--algorithms={",".join(ALGORITHMS)}', '--num_clients=10',
          '--participations=1,0.2', '--splits=iid,dirichlet:0.3', '--total_rounds=3',
          '--client_epochs_per_round=1', '--targets=0.2,0.999', f'--root_output_dir={tmp_path}']
  res = _run(*args)
  assert res.returncode == 0, res.stderr[-3000:]
  js = json.loads(res.stdout.strip().splitlines()[-1])
  assert js['runs'] == 2 * 2 * len(ALGORITHMS) and js['figures'] == 4
  root = tmp_path / 'paper003_feddyn_digits'
  with open(root / 'results.csv') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == js['runs'] * 2
  per_round = {r['algorithm']: float(r['models_per_round']) for r in rows}
  expected = {'feddyn': 1, 'fedavg': 1, 'fedprox': 1, 'scaffold': 2}
  for alg in ALGORITHMS:
    assert per_round[alg] == pytest.approx(expected[alg], abs=1e-3)
  for r in rows:
    if float(r['target']) == 0.999:  # unreachable in 3 rounds: all rounds count
      assert r['reached'] == 'False'
      assert float(r['models_transmitted']) == pytest.approx(3 * float(r['models_per_round']))
  assert {r['clients_per_round'] for r in rows} == {'10', '2'}
  assert all(c.endswith('+') or '+ (' in c for k, v in js['cells'].items() if k.endswith('0.999')
             for c in v.values())
  assert (root / 'tables.md').exists()
  assert (root / 'figures' / 'dirichlet0.3_p0.2.png').exists()
  # Re-running resumes every finished run instead of training again.
  again = _run(*args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert json.loads(again.stdout.strip().splitlines()[-1])['cells'] == js['cells']


# A grid of one short run: a flag that the binary fails to refuse costs seconds, not the
# default grid's hours.
SMALL = ('--algorithms=fedavg', '--participations=1', '--splits=iid', '--num_clients=5',
         '--total_rounds=1', '--client_epochs_per_round=1')


def _run_main(*args, cwd, timeout=300):
  """The binary as `python -m experiments.feddyn` runs it (its defaults set)."""
  return run_binary('feddyn', *args, '--noprogress', cwd=cwd, timeout=timeout, as_main=True)



@pytest.mark.parametrize('flag,instead', [
    ('--experiment_name=mine', '--name'), ('--algorithm=scaffold', '--algorithms'),
    ('--seed=3', '--run_seeds'), ('--clients_per_round=2', '--participations'),
    ('--participation_prob=0.5', '--participations'), ('--partition=dirichlet', '--splits'),
    ('--dirichlet_alpha=0.3', '--splits'), ('--unbalanced_sigma=0.3', '--unbalanced_sigmas'),
])
def test_trainer_flags_the_grid_sets_itself_are_refused(tmp_path, flag, instead):
  """--experiment_name, --algorithm, --seed, ... were accepted (the binary
  defines the trainer's flags) and ignored: every run took the grid's own
  values (--algorithm=scaffold still ran all --algorithms)."""
  res = _run_main(*SMALL, flag, f'--root_output_dir={tmp_path / "root"}', cwd=tmp_path)
  assert_refused(res, flag.split('=')[0] + ' is not read', f'use {instead}')
  assert os.listdir(tmp_path) == []


def test_synthetic_heterogeneity_is_refused_for_synthetic_logistic_only(tmp_path):
  res = _run_main('--task=synthetic_logistic', '--synthetic_heterogeneity=type1', *SMALL,
                  f'--root_output_dir={tmp_path / "root"}', cwd=tmp_path)
  assert_refused(res, '--synthetic_heterogeneity', '--heterogeneities')
  assert os.listdir(tmp_path) == []


def test_a_name_outside_the_root_is_refused(tmp_path):
  """--name=../escape wrote the grid next to --root_output_dir."""
  res = _run_main(*SMALL, '--name=../escape', f'--root_output_dir={tmp_path / "root"}',
                  cwd=tmp_path)
  assert_refused(res, '--name must be one directory name', '../escape')
  assert os.listdir(tmp_path) == []


def test_a_reference_algorithm_not_in_the_grid_is_refused(tmp_path):
  """--reference_algorithm=scafold (a typo) fell back to the first algorithm
  quietly: every ratio was to another method than asked for."""
  res = _run_main(*SMALL[1:], '--algorithms=fedavg,scaffold', '--reference_algorithm=scafold',
                  f'--root_output_dir={tmp_path / "root"}', cwd=tmp_path)
  assert_refused(res, "--reference_algorithm='scafold'", 'choose from fedavg, scaffold')
  assert os.listdir(tmp_path) == []


def test_a_percentage_target_of_an_accuracy_is_refused(tmp_path):
  """--targets=85 for an accuracy in [0, 1] was never reached: every cell N+."""
  from experiments import feddyn
  with pytest.raises(ValueError, match=r'--targets: 85 is above 1.*write 0\.85 for 85%'):
    feddyn.check_targets([0.5, 85.0], 'eval/sparse_categorical_accuracy')
  with pytest.raises(ValueError, match='accuracy in'):
    feddyn.check_targets([850.0], 'eval/accuracy')
  feddyn.check_targets([85.0], 'eval/loss')  # a loss may be above 1
  feddyn.check_targets([0.85, 1.0], 'eval/sparse_categorical_accuracy')
  res = _run_main(*SMALL, '--targets=0.5,85', f'--root_output_dir={tmp_path / "root"}',
                  cwd=tmp_path)
  assert_refused(res, '--targets: 85 is above 1', 'write 0.85')
  assert os.listdir(tmp_path) == []


def test_note_missing_target_metric_names_the_runs_and_their_metrics(capsys):
  from experiments import feddyn
  feddyn.note_missing_metric([], 4, 'eval/acc')
  assert capsys.readouterr().err == ''
  have = ['eval/sparse_categorical_accuracy', 'eval/loss']
  feddyn.note_missing_metric([('iid p=1 fedavg seed 0', have)], 2, 'eval/acc')
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith('note: 1 of 2 runs (iid p=1 fedavg seed 0)')
  assert "'eval/acc' (--target_metric)" in err[0] and ', '.join(have) in err[0]


@pytest.mark.slow  # the note's text: test_note_missing_target_metric_names_the_runs_...
def test_a_target_metric_that_no_run_has_is_noted(tmp_path):
  """--target_metric=eval/acc (misspelt) made every cell 'N+' with no word of why."""
  res = _run(*SMALL, '--target_metric=eval/acc', '--targets=0.5',
             f'--root_output_dir={tmp_path}', timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  notes = [l for l in res.stderr.splitlines() if l.startswith('note:') and 'eval/acc' in l]
  assert len(notes) == 1, res.stderr[-3000:]
  assert notes[0].startswith("note: no run has metric 'eval/acc' (--target_metric)")
  assert 'every cell reads N+' in notes[0]
  assert 'eval/sparse_categorical_accuracy' in notes[0]
  assert json.loads(res.stdout.strip().splitlines()[-1])['cells'] == {
      'iid|p1|0.5': {'fedavg': '1+'}}


def test_a_task_with_its_own_split_runs_the_settings_it_has(tmp_path):
  """feddyn set --partition for every setting, and the trainer now refuses a
  split flag the task does not read: `--task=digits --splits=dirichlet:0.3`
  could not run at all. Now a Dirichlet setting on digits (whose split is
  Dirichlet label skew) sets only alpha, a split the task cannot have is
  refused when asked for and left out (with a note) when it is a default."""
  res = _run_main('--task=digits', '--splits=dirichlet:0.3', '--algorithms=fedavg',
                  '--participations=1', '--run_seeds=0', '--total_rounds=1', '--targets=0.5',
                  f'--root_output_dir={tmp_path / "root"}', cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  summary = next(l for l in reversed(res.stdout.splitlines()) if l.startswith('{'))
  assert 'dirichlet0.3|p1|0.5' in json.loads(summary)['cells']
  res = _run_main('--task=digits', '--splits=iid', *SMALL[1:],
                  f'--root_output_dir={tmp_path / "root2"}', cwd=tmp_path)
  assert_refused(res, "'iid' sets --partition, which task 'digits' does not read (it "
                      'reads --dirichlet_alpha)')
  from absl import flags
  from experiments import feddyn
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['feddyn', '--task=emnist_character'])
  try:
    assert feddyn.settings() == [('natural', {})]  # TFF's writers: one setting
  finally:
    flags.FLAGS.unparse_flags()
