"""Experiment binaries end to end (small settings)."""

import json
import os
import subprocess
import sys

import pytest

from paths import ROOT
from tff_algos.core import schedules



def run_module(module, *args, timeout=900, progress_flag=True):  # noqa: D103
  extra = ['--noprogress'] if progress_flag else []  # the benchmark draws no bars
  res = subprocess.run([sys.executable, '-m', module, *args, *extra], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=timeout)
  assert res.returncode == 0, res.stderr[-3000:]
  return res.stdout, json.loads(res.stdout.strip().splitlines()[-1])


def test_quadratic_toy_prints_json_and_figure(tmp_path):
  out, js = run_module('experiments.quadratic_toy', '--rounds=25', '--seeds=3',
                       '--runs=const_k10,decay_k,decay_gamma', '--server_learning_rate=1',
                       '--num_clients=500', f'--output_dir={tmp_path}')
  assert set(js) >= {'x_star', 'surrogate_minimiser', 'final_x', 'client_steps'}
  assert js['x_star'] == pytest.approx(0.52337, abs=1e-5)
  assert js['surrogate_minimiser']['10'] == pytest.approx(0.55703, abs=1e-5)
  assert js['client_steps'] == {'const_k10': 250, 'decay_k': schedules.LocalSteps(10, 0.995).total(25),
                                'decay_gamma': 250}
  assert set(js['final_x']) == {'const_k10', 'decay_k', 'decay_gamma'}
  assert all(0.3 < v < 0.8 for v in js['final_x'].values())
  assert os.path.exists(tmp_path / 'figure1.png')
  assert 'minus_x*' in out


@pytest.mark.slow
def test_local_update_decay_figure_pipeline(tmp_path):
  _, js = run_module('experiments.local_update_decay', '--figure=fig8',
                     '--tasks=emnist_character', '--use_synthetic_data', '--rounds=3',
                     '--gammas=1,0.1', '--etas=0.1,1', '--select_last_rounds=2',
                     '--decay_window=1', f'--root_output_dir={tmp_path}')
  curves = js['tail_loss']['emnist_character']
  assert set(curves) == {'1e0', '1e-1', 'decay'}
  assert js['emnist_model'] == 'cnn' and js['decay_semantics'] == 'paper'
  etas = js['log10_eta']['emnist_character']
  assert set(etas) == set(curves) and all(e in (-1.0, 0.0) for e in etas.values())
  norms = js['update_norm']['emnist_character']['1e-1']
  assert len(norms['mean']) == 1 and norms['mean'][0] > 0 and norms['std'][0] >= 0
  assert os.path.exists(tmp_path / 'fig8' / 'emnist_character.png')


@pytest.mark.slow
def test_benchmark_model_timings_for_gpu_vs_cpu():
  out, js = run_module('experiments.benchmark', '--quick', '--models_only',
                       '--models=emnist_cnn', progress_flag=False)
  assert 'overhead_vs_pure_tf' not in js and js['devices']  # (a)-(f) skipped
  m = js['models']['emnist_cnn']
  assert m['rounds_per_second'] == pytest.approx(1 / m['seconds_per_round'])
  assert 0.5 < m['overhead_vs_pure_tf'] < 5 and m['pure_tf_floor_seconds'] > 0
  assert 'emnist_cnn: our FedAvg' in out  # printed as measured


def test_benchmark_flag_errors():
  for flags, message in ((['--models=resnet50'], 'unknown resnet50'),
                         (['--models_only'], '--models_only needs --models')):
    res = subprocess.run([sys.executable, '-m', 'experiments.benchmark', *flags], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode != 0 and message in res.stderr


@pytest.mark.slow
def test_benchmark_prints_the_ratio_json():
  _, js = run_module('experiments.benchmark', '--quick', progress_flag=False)
  assert set(js) >= {'overhead_vs_pure_tf', 'ratio_vs_tff_builtin', 'per_algorithm',
                     'scaling', 'fixed_ms_per_round', 'pure_tf_per_client_vs_floor',
                     'overhead_vs_pure_tf_per_client'}
  # (a) splits into its two parts (medians of different pairs: not exactly).
  split = js['pure_tf_per_client_vs_floor'] * js['overhead_vs_pure_tf_per_client']
  assert 0.7 * js['overhead_vs_pure_tf'] < split < 1.4 * js['overhead_vs_pure_tf']
  assert set(js['scaling']) == {'10', '20', '40'}
  assert js['per_algorithm_pairs'] == 3  # --quick: 3 round pairs per algorithm
  # (c) covers the whole registry (each algorithm timed, or its failure named),
  # and its ratios order algorithms by their work per round: FedSGD's one
  # gradient per client costs less than FedAvg's 10 local steps, Mimelite's
  # extra full-batch gradient more.
  from tff_algos.algorithms import registry
  from tff_algos.flags import algorithm_flags
  ratios = js['per_algorithm']
  assert set(ratios) | set(js['per_algorithm_not_run']) == set(registry.ALGORITHMS)
  assert ratios['fedsgd'] < 0.6 * ratios['fedavg']
  assert ratios['mimelite'] > 1.2 * ratios['fedavg']
  # Those that need Adam are timed over a FedAvg running Adam (like with like),
  # their ratio over the SGD FedAvg kept beside.
  assert js['per_algorithm_baseline']['mimelite'] == 'fedavg with client adam'
  assert set(js['per_algorithm_vs_sgd_fedavg']) == set(js['per_algorithm_baseline'])
  assert 'fedprox' not in js['per_algorithm_baseline']
  # (h) the trainer end to end: the longer run took longer, and the marginal
  # round cost and start-up reproduce the measured run lengths.
  runs = {int(n): t for n, t in js['trainer_run_seconds'].items()}
  (short, t_short), (long, t_long) = sorted(runs.items())
  assert t_long > t_short
  assert js['startup_s'] + short * js['trainer_ms_per_round'] / 1000 == pytest.approx(t_short)
  chained = {int(n): t for n, t in js['trainer_run_seconds_10_per_call'].items()}
  assert js['startup_s_10_per_call'] + short * js['trainer_ms_per_round_10_per_call'] / 1000 \
      == pytest.approx(chained[short])
  # The marginal round is the two runs' difference less their own seconds to
  # their first round (each within its run).
  for key, seconds, suffix in (('trainer_ms_per_round', runs, ''),
                               ('trainer_ms_per_round_10_per_call', chained, '_10_per_call')):
    to_first = {int(n): t for n, t in js[f'trainer_seconds_to_first_round{suffix}'].items()}
    assert all(0 < to_first[n] < seconds[n] for n in (short, long)), suffix
    assert js[key] * (long - short) / 1000 == pytest.approx(
        (seconds[long] - to_first[long]) - (seconds[short] - to_first[short]))
  assert js['grid_runs_per_minute'] == pytest.approx(12 * 60 / js['grid_seconds'])
  # Inside one run a round costs something, and less than the run's average
  # round with its start-up.
  for key, seconds in (('trainer_ms_per_round_in_run', t_long),
                       ('trainer_ms_per_round_10_per_call_in_run', chained[long])):
    assert 0 < js[key] < 1000 * seconds / long, key


def test_a_title_the_font_lacks_draws_without_a_warning_per_glyph(tmp_path):
  """An experiment name in CJK (the figure's title) printed matplotlib's
  'Glyph N missing from current font' once per glyph and drawing (8 lines for
  a 4-character name); the figure is still written."""
  import warnings
  from experiments import report
  rows = [{'round': 1, 'client_work/train/loss': 1.0, 'eval/loss': 2.0},
          {'round': 2, 'client_work/train/loss': 0.5, 'eval/loss': 1.5}]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always', UserWarning)
    path = report.plot_training(rows, str(tmp_path / 'curves.png'), title='实验 テスト')
  assert os.path.getsize(path) > 1000
  assert not [w for w in caught if 'Glyph' in str(w.message)], [str(w.message) for w in caught]
