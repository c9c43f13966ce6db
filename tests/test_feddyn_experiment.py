"""experiments/feddyn.py: paper 003 tables (models transmitted to a target)."""

import csv
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paper's four methods, all registered in tff_algos.registry.
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
  from tff_algos import metrics_tables
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
