"""The grid driver: parsing, scoring, and one small end-to-end grid."""

import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_grid_and_score():
  from experiments import grid
  axes = grid.parse_grid('client_learning_rate=1, 0.1; local_steps=10')
  assert axes == [('client_learning_rate', ['1', '0.1']), ('local_steps', ['10'])]
  for bad in ('', 'nope=1', 'local_steps', 'local_steps='):
    with pytest.raises(ValueError):
      grid.parse_grid(bad)
  rows = [{'round': r, 'eval/acc': r / 10} for r in (2, 4, 6, 8)] + [{'round': 9.0}]
  assert grid.score(rows, 'eval/acc', 5) == pytest.approx((0.6 + 0.8) / 2)
  assert grid.score(rows, 'eval/acc', 100) == pytest.approx(0.5)


def test_small_grid_runs_every_combination(tmp_path):
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.grid', '--model=logistic', '--total_rounds=3',
       '--rounds_per_eval=1', '--clients_per_round=3', '--local_steps=2',
       "--grid=client_learning_rate=0.5,0.0", '--group_by=client_learning_rate',
       '--select_last_rounds=2', f'--root_output_dir={tmp_path}', '--noprogress'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  with open(tmp_path / 'grid_digits' / 'grid.csv') as f:
    rows = list(csv.DictReader(f))
  assert [r['client_learning_rate'] for r in rows] == ['0.5', '0.0']  # sorted by score
  assert float(rows[0]['score']) > float(rows[1]['score'])  # lr 0 cannot learn
  assert 'best per client_learning_rate' in res.stdout
