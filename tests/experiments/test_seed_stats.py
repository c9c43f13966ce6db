"""Results over seeds: mean, std, 95 % CI, max of the averaged curve, markdown tables."""

import json
import math

import pytest

from experiments import reproduce
from experiments import seed_stats
from experiments.configs import base

# Student t quantiles t_{0.975, dof}, from printed tables.
T975 = {1: 12.7062, 2: 4.3027, 4: 2.7764}


def test_summarize_mean_std_and_t_interval():
  s = seed_stats.summarize([1.0, 2.0, 3.0])
  assert s['mean'] == 2.0 and s['std'] == pytest.approx(1.0) and s['n'] == 3
  half = T975[2] * 1.0 / math.sqrt(3)
  assert s['ci95'] == pytest.approx([2.0 - half, 2.0 + half], abs=1e-4)
  five = seed_stats.summarize([0.80, 0.82, 0.79, 0.81, 0.83])
  assert five['std'] == pytest.approx(0.0158114, rel=1e-5)
  assert five['ci95'][1] - five['mean'] == pytest.approx(T975[4] * 0.0158114 / math.sqrt(5),
                                                         rel=1e-4)


def test_missing_seeds_are_counted_not_zero():
  s = seed_stats.summarize([10.0, None, 30.0])
  assert s['mean'] == 20.0 and s['n'] == 2 and s['missing'] == 1
  assert s['per_seed'] == [10.0, None, 30.0]
  assert seed_stats.summarize([None, None])['mean'] is None


def test_one_seed_has_no_interval():
  s = seed_stats.summarize([0.5])
  assert s['mean'] == 0.5 and s['std'] is None and s['ci95'] is None
  assert seed_stats.contains(s, 0.5) is None
  wide = seed_stats.summarize([0.4, 0.6])
  assert seed_stats.contains(wide, 0.5) and not seed_stats.contains(wide, 2.0)


def test_max_accuracy_is_the_peak_of_the_seed_averaged_curve():
  # Each seed peaks at another round: the mean of the per-seed maxima (0.925)
  # overstates the averaged curve's maximum (0.775, at round 3).
  a = [(1, 0.5), (2, 0.9), (3, 0.6)]
  b = [(1, 0.5), (2, 0.6), (3, 0.95)]
  peak = seed_stats.peak_of_mean_curve([a, b])
  assert peak['round'] == 3 and peak['mean'] == pytest.approx(0.775)
  assert peak['per_seed'] == [0.6, 0.95] and peak['per_seed_max'] == [0.9, 0.95]
  # Rounds evaluated by only some seeds are not averaged.
  assert seed_stats.mean_curve([a, b[:2]]) == [(1, 0.5), (2, 0.75)]


def _exp(published, seeds=(0, 1)):
  return base.Experiment(
      name='fedopt_baselines_toy', paper='test', ref='Table 0', description='toy',
      runner=base.TrainerRuns(task='digits', runs=(base.Run('fedavg', 'fedavg'),),
                              total_rounds=3, clients_per_round=2, seeds=seeds),
      published=published)


def _run(seed, accs):
  rows = [{'round': i + 1, 'eval/sparse_categorical_accuracy': a, 'eval/loss': 1 - a}
          for i, a in enumerate(accs)]
  return dict(label='fedavg', seed=seed, rows=rows, summary={})


def test_measure_stats_over_seeds_and_table_says_if_published_is_inside():
  pubs = (base.Published('fedavg/max_accuracy', 0.77, 'Table 1'),
          base.Published('fedavg/final_accuracy', 0.99, 'Table 1'),
          base.Published('fedavg/rounds_to0.9', 2, 'Table 1'))
  exp = _exp(pubs)
  results = dict(runs=[_run(0, [0.5, 0.9, 0.6]), _run(1, [0.5, 0.6, 0.95])])
  stats = reproduce.measure_stats(exp, results)
  assert stats['fedavg/max_accuracy']['mean'] == pytest.approx(0.775)
  assert stats['fedavg/final_accuracy']['per_seed'] == [0.6, 0.95]
  assert stats['fedavg/final_accuracy']['seeds'] == [0, 1]
  reached = stats['fedavg/rounds_to0.9']
  assert reached['per_seed'] == [2.0, 3.0] and reached['missing'] == 0
  assert reproduce.measure(exp, results)['fedavg/max_accuracy'] == pytest.approx(0.775)
  table = reproduce.experiment_table(
      exp, {'full': dict(measured={k: v['mean'] for k, v in stats.items()}, stats=stats,
                         rounds={'x': 3})})
  lines = table.splitlines()
  assert all(l.startswith('|') and l.endswith('|') for l in lines)
  assert len({l.count('|') for l in lines}) == 1 and set(lines[1]) <= set('|-')
  header = [c.strip() for c in lines[0].strip('|').split('|')]
  cells = {[c.strip() for c in l.strip('|').split('|')][header.index('quantity')]:
           dict(zip(header, [c.strip() for c in l.strip('|').split('|')])) for l in lines[2:]}
  # max: seeds at round 3 are 0.6 and 0.95, CI 0.775 ± 12.71·0.2475/√2 covers 0.77.
  assert cells['fedavg/max_accuracy']['published in CI'] == 'yes'
  assert cells['fedavg/max_accuracy']['seeds'] == '2'
  assert cells['fedavg/final_accuracy']['published in CI'] == 'yes'
  narrow = dict(stats, **{'fedavg/final_accuracy': seed_stats.summarize([0.6, 0.61])})
  table = reproduce.experiment_table(exp, {'full': dict(
      measured={'fedavg/final_accuracy': 0.605}, stats=narrow)})
  assert '| no |' in table


def test_binary_values_per_seed():
  exp = base.Experiment(
      name='feddyn_table6_toy', paper='003', ref='Table 6', description='toy',
      runner=base.Binary('experiments.nastya', {}, {}),
      published=(base.Published('table.a.feddyn', 30, 'Table 6'),
                 base.Published('table.a.scaffold', 70, 'Table 6'),
                 base.Published('gap', 0.1, 'Fig. 1')))
  payload = {'table': {'a': {'feddyn': {'per_seed': [28, 34, None]},
                             'scaffold': [60, 80]}}, 'gap': 0.2}
  stats = reproduce.measure_stats(exp, {'json': payload})
  assert stats['table.a.feddyn']['mean'] == 31 and stats['table.a.feddyn']['missing'] == 1
  assert stats['table.a.scaffold']['ci95'] is not None
  assert stats['gap']['mean'] == 0.2 and stats['gap']['n'] == 1
  json.dumps(stats)  # result.json can hold it


def test_plot_with_several_seeds(tmp_path):
  exp = _exp(())
  results = dict(runs=[_run(0, [0.5, 0.9, 0.6]), _run(1, [0.5, 0.6, 0.95])])
  path = reproduce._plot(exp, results, str(tmp_path))
  assert path and (tmp_path / 'plot.png').stat().st_size > 1000
