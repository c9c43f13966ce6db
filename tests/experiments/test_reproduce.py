"""The reproduction harness: configs, plans, measured quantities, report."""

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from binaries import assert_refused, run_binary
from experiments import reproduce
from experiments.configs import base
from experiments.lib import plans
from tff_algos.algorithms import groups
from paths import ROOT



def _toy(published=()):
  return base.Experiment(
      name='fedopt_baselines_toy', paper='test', ref='Table 0', description='toy',
      runner=base.TrainerRuns(
          task='emnist_character', task_flags=dict(model='cnn'),
          runs=(base.Run('fedavg', 'fedavg', dict(local_steps=20, client_learning_rate=0.1)),
                base.Run('fedsgd', 'fedsgd', dict(server_learning_rate=0.5))),
          common_flags=dict(client_batch_size=16),
          total_rounds=1500, clients_per_round=10, seeds=(0, 1, 2),
          smoke_rounds=2, smoke_clients_per_round=3),
      published=published)


def test_experiment_names_are_prefixed_by_paper():
  with pytest.raises(ValueError, match='must start with'):
    base.Experiment(name='toy', paper='', ref='', description='',
                    runner=base.Binary('experiments.nastya', {}, {}))
  with pytest.raises(ValueError, match='duplicate run labels'):
    base.Experiment(name='feddyn_x', paper='', ref='', description='',
                    runner=base.TrainerRuns('digits', (base.Run('a', 'fedavg'),
                                                       base.Run('a', 'fedsgd')), 5, 2))


def test_plans_full_and_smoke():
  exp = _toy()
  full = reproduce.trainer_plans(exp, 'full')
  assert len(full) == 6 and {p.seed for p in full} == {0, 1, 2}
  f = full[0].flags
  assert (f['task'], f['model'], f['total_rounds'], f['clients_per_round'],
          f['local_steps'], f['client_batch_size']) == ('emnist_character', 'cnn', 1500,
                                                         10, 20, 16)
  smoke = reproduce.trainer_plans(exp, 'smoke')
  assert [p.name for p in smoke] == ['fedavg_seed0', 'fedsgd_seed0']
  s = smoke[0].flags
  assert s['task'] == 'digits' and 'model' not in s
  assert (s['total_rounds'], s['clients_per_round'], s['local_steps'],
          s['rounds_per_eval']) == (2, 3, plans.SMOKE_MAX_LOCAL_STEPS, 1)
  assert smoke[1].flags['algorithm'] == 'fedsgd'
  cmd = full[0].command('out')
  assert cmd.startswith('python -m experiments.train ') and '--local_steps=20' in cmd
  bad = base.Experiment(name='feddyn_bad', paper='', ref='', description='',
                        runner=base.TrainerRuns('digits', (base.Run('a', 'fedavg', {'seed': 3}),),
                                                5, 2))
  with pytest.raises(ValueError, match='set by the runner'):
    reproduce.trainer_plans(bad, 'full')


def test_plans_go_through_trainer_validation():
  exp = _toy()
  for plan in reproduce.trainer_plans(exp, 'smoke'):
    reproduce.validate_plan(plan)
  wrong = base.Experiment(name='feddyn_wrong', paper='', ref='', description='',
                          runner=base.TrainerRuns(
                              'digits', (base.Run('a', 'fedavg', {'local_stepz': 3}),), 5, 2))
  with pytest.raises(ValueError, match='not trainer flags: local_stepz'):
    reproduce.validate_plan(reproduce.trainer_plans(wrong, 'full')[0])
  negative = base.Experiment(name='feddyn_neg', paper='', ref='', description='',
                             runner=base.TrainerRuns(
                                 'digits', (base.Run('a', 'fedavg', {'local_steps': 0}),), 5, 2))
  with pytest.raises(ValueError, match='a_seed0'):
    reproduce.validate_plan(reproduce.trainer_plans(negative, 'full')[0])


def _rows():
  acc = [0.1, 0.5, 0.7, 0.65, 0.8]
  return [{'round': i + 1, 'eval/sparse_categorical_accuracy': a, 'eval/loss': 1 - a,
           'download_bytes': 2000.0, 'upload_bytes': 1000.0, 'client_flops': 5.0}
          for i, a in enumerate(acc)]


def test_run_metrics_from_rows():
  rows = _rows()
  summary = dict(model_bytes=100, download_bytes_per_client=200, clients_per_round=10)
  m = lambda name: reproduce.run_metric(rows, summary, name)
  assert m('final_accuracy') == 0.8 and m('max_accuracy') == 0.8
  assert m('mean_accuracy_last2') == pytest.approx((0.65 + 0.8) / 2)
  assert m('final_loss') == pytest.approx(0.2)
  assert m('rounds_to0.7') == 3.0 and m('rounds_to0.9') is None
  # 3 rounds x 2000 bytes / (100 bytes x 10 clients) = 6 models: 2 per round
  # (a SCAFFOLD-like download of model + control variate).
  assert m('models_to0.7') == pytest.approx(6.0)
  assert m('upload_gb_to0.5') == pytest.approx(2000 / 1e9)
  assert m('flops_to0.5') == 10.0
  with pytest.raises(ValueError, match='unknown metric'):
    m('best_thing')


def test_table_marks_scale_and_missing():
  pubs = (base.Published('fedavg/final_accuracy', 0.849, 'Table 2', 'FedAvg'),
          base.Published('fedsgd/final_accuracy', 0.5, 'Fig. 1', approximate=True))
  exp = _toy(pubs)
  not_run = reproduce.experiment_table(exp, {})
  assert not_run.count('not run') == 2
  smoke = {'smoke': dict(measured={'fedavg/final_accuracy': 0.5}, rounds={'a': 2})}
  table = reproduce.experiment_table(exp, smoke)
  assert 'smoke only (not comparable)' in table and '-0.349' in table
  assert '(≈, from figure)' in table
  full = {'full': dict(measured={'fedavg/final_accuracy': 0.85}, rounds={'a': 1500}),
          **smoke}
  assert 'smoke only' not in reproduce.experiment_table(exp, full).split('\n')[2]
  assert '1500' in reproduce.experiment_table(exp, full)
  # A cost to a target that the run did not reach says so.
  reach = _toy((base.Published('fedavg/models_to0.9', 50, 'Table 6', to_target=True),))
  assert 'not run' in reproduce.experiment_table(reach, {})
  assert 'not reached' in reproduce.experiment_table(reach, {'full': dict(
      measured={'fedavg/models_to0.9': None}, rounds={'a': 10})})


def test_a_seeds_runs_go_in_a_row_and_results_keep_the_plans_order(tmp_path, monkeypatch):
  """The harness trains seed by seed (TensorFlow seeded once per seed), and
  hands back its runs in the plans' order."""
  from tff_algos.algorithms import registry
  from tff_algos.flags import algorithm_flags
  from tff_algos import training
  import tasks
  trained = []

  def fake_run(algorithm, task, config, **kwargs):
    del algorithm, task, kwargs
    trained.append(os.path.basename(config.output_dir))
    return types.SimpleNamespace(summary={})
  monkeypatch.setattr(training, 'run_training', fake_run)
  monkeypatch.setattr(training, 'read_metrics', lambda path: [])
  monkeypatch.setattr(tasks, 'get_task',
                      lambda name, options: types.SimpleNamespace(model_fn=None))
  monkeypatch.setattr(registry.BuildCache, 'build', lambda self, name, model_fn, hp: name)
  results = reproduce._run_trainer(_toy(), 'full', str(tmp_path), False, False)  # pylint: disable=protected-access
  assert trained == ['fedavg_seed0', 'fedsgd_seed0', 'fedavg_seed1', 'fedsgd_seed1',
                     'fedavg_seed2', 'fedsgd_seed2']
  assert [(r['label'], r['seed']) for r in results['runs']] == [
      ('fedavg', 0), ('fedavg', 1), ('fedavg', 2), ('fedsgd', 0), ('fedsgd', 1), ('fedsgd', 2)]


def test_smoke_run_writes_result_table_plot(tmp_path):
  pubs = (base.Published('fedavg/final_accuracy', 0.849, 'Table 2'),
          base.Published('fedsgd/max_accuracy', 0.5, 'Table 2'))
  exp = _toy(pubs)
  result = reproduce.run_experiment(exp, 'smoke', str(tmp_path), manage_runtime=False)
  out = tmp_path / 'smoke' / exp.name
  saved = json.loads((out / 'result.json').read_text())
  for key in ('fedavg/final_accuracy', 'fedsgd/max_accuracy'):
    assert 0.0 <= saved['measured'][key] <= 1.0
  assert saved['rounds'] == {'fedavg_seed0': 2, 'fedsgd_seed0': 2}
  assert (out / 'plot.png').stat().st_size > 1000
  assert 'Table 2' in (out / 'table.md').read_text()
  # The trainer wrote an ordinary, resumable run directory.
  rows = (out / 'runs' / 'fedavg_seed0' / 'metrics.csv').read_text().splitlines()
  assert len(rows) == 3
  report = reproduce.full_report(str(tmp_path), {exp.name: exp})
  assert 'smoke only' in report and '0 of 1 experiments run at full scale' in report
  assert result['measured'] == saved['measured']


def test_binary_argv_and_lookup(tmp_path):
  # As a library call from a fresh process: absl flags not parsed (it used to
  # raise UnparsedFlagAccessError reading --workers, depending on test order).
  from absl import flags
  flags.FLAGS.unparse_flags()
  exp = base.Experiment(name='decaying_k_toy', paper='', ref='', description='',
                        runner=base.Binary('experiments.quadratic_toy', {'rounds': 3000},
                                           {'rounds': 5, 'runs': ['const_k10', 'decay_k']}))
  argv = reproduce.binary_argv(exp, 'smoke', 'out')
  assert argv[1:3] == ['-m', 'experiments.quadratic_toy']
  assert '--rounds=5' in argv and '--runs=const_k10,decay_k' in argv
  assert '--output_dir=out' in argv and '--progress=false' in argv
  assert '--backend=inprocess' in argv  # reproduce's --backend, passed on
  assert reproduce.lookup({'final_x': {'decay_k': 0.5}}, 'final_x.decay_k') == 0.5
  assert reproduce.lookup({'final_x': {}}, 'final_x.decay_k') is None


# ---------------------------------------------------------------------------
# The shipped configs.

def _binary_flags(module: str) -> set[str]:
  src = open(os.path.join(ROOT, *module.split('.')) + '.py').read()
  return set(re.findall(r"DEFINE_\w+\(\s*'(\w+)'", src))


def test_every_config_is_valid():
  from experiments import configs
  from tff_algos.algorithms import registry
  from tff_algos.flags import algorithm_flags
  experiments = configs.all_experiments()
  assert len(experiments) >= 10
  prefixes = {n.split('_')[0] for n in experiments}
  assert {'decaying', 'nastya', 'local', 'feddyn', 'fedgbo', 'fedopt'} <= prefixes
  for name, exp in experiments.items():
    # Figure-only results (papers 001, 002: curves, no printed numbers) explain
    # themselves in notes; the report lists them apart.
    assert exp.published or len(exp.notes) > 40, f'{name}: no published numbers, no notes'
    if isinstance(exp.runner, base.Binary):
      known = _binary_flags(exp.runner.module)
      src = open(os.path.join(ROOT, *exp.runner.module.split('.')) + '.py').read()
      assert ('import runtime_flags' in src or 'import flags as trainer_flags' in src), (
          f'{exp.runner.module} does not take --backend, which reproduce passes on')
      for values in (exp.runner.flags, exp.runner.smoke_flags):
        assert set(values) <= known, (name, set(values) - known)
      continue
    labels = {r.label for r in exp.runner.runs}
    for run in exp.runner.runs:
      assert run.algorithm in registry.ALGORITHMS, (name, run.algorithm)
    for pub in exp.published:
      label, _, metric = pub.key.partition('/')
      assert label in labels, (name, pub.key)
      reproduce.run_metric(_rows(), {}, metric)  # raises for an unknown metric
    for scale in ('smoke', 'full'):
      for plan in reproduce.trainer_plans(exp, scale):
        reproduce.validate_plan(plan)


def test_list_prints_every_experiment():
  from experiments import configs
  proc = subprocess.run([sys.executable, '-m', 'experiments.reproduce', '--list'],
                        capture_output=True, text=True, cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  listed = [l.split()[0] for l in proc.stdout.splitlines() if l.strip()]
  assert listed == list(configs.all_experiments())


def _all_names():
  try:
    from experiments import configs
    return list(configs.all_experiments())
  except Exception:  # reported by test_every_config_is_valid
    return []


@pytest.mark.slow
@pytest.mark.parametrize('name', _all_names())
def test_every_experiment_runs_at_smoke_scale(name, tmp_path):
  from experiments import configs
  exp = configs.get(name)
  result = reproduce.run_experiment(exp, 'smoke', str(tmp_path), manage_runtime=False)
  out = tmp_path / 'smoke' / name
  assert (out / 'table.md').exists() and (out / 'result.json').exists()
  assert result['plot'] and os.path.getsize(result['plot']) > 1000
  to_target = {p.key for p in exp.published if p.to_target}
  for key, value in result['measured'].items():
    metric = key.partition('/')[2] if isinstance(exp.runner, base.TrainerRuns) else key
    if key not in to_target and (isinstance(exp.runner, base.Binary) or not metric.split(
        '_to')[0] in ('rounds', 'models', 'upload_gb', 'flops')):
      # Anything but "cost to reach a target" must be measurable in a smoke run.
      assert value is not None and np.isfinite(value), (name, key)


# --- paper 000 (decaying K): Table 1 as the paper's setting -------------------

def test_paper000_stackoverflow_is_app_b_setting():
  from experiments.configs import paper000
  exp = paper000.STACKOVERFLOW
  for plan in reproduce.trainer_plans(exp, 'full'):
    f = plan.flags
    assert (f['max_client_examples'], f['test_examples'], f['num_clients']) == (250, 10000, 1000)
    assert f['model'] == 'logreg_mean'  # Keras's mean loss, paper 000's units
    # One test set for periodic and final evaluations: no smaller periodic sample.
    assert 'max_eval_examples' not in f
    cmd = plan.command('out')
    assert '--max_client_examples=250' in cmd and '--test_examples=10000' in cmd
  for plan in reproduce.trainer_plans(exp, 'smoke'):
    assert 'max_client_examples' not in plan.flags and 'test_examples' not in plan.flags


def test_paper000_table1_every_row_is_compared():
  from experiments.configs import paper000
  so, femnist, shakespeare = ({p.key: p.value for p in e.published}
                              for e in paper000.EXPERIMENTS[1:4])
  assert so['decay_gamma_K10/min_train_loss_smooth200'] == 0.02
  assert so['decay_K_K100/max_accuracy'] == 0.42
  assert femnist['decay_K_K33/min_train_loss_smooth200'] == 0.14
  assert femnist['decay_K_K33/fraction_sgd_steps'] == 0.26
  assert shakespeare['decay_K_K100/min_train_loss_smooth200'] == 0.84
  for keys in (so, femnist, shakespeare):
    # 3 K x (decaying gamma, decaying K) x (max acc, min train error) + 3 step fractions.
    assert len(keys) == 15
    assert len([k for k in keys if k.endswith('/fraction_sgd_steps')]) == 3


def test_paper000_panels_a_are_experiments_of_their_own():
  """Figs. 2-4 (a), the constant-gamma/K runs, are listed and runnable (they were
  reachable only from Python); with the Table 1 experiments they are every run
  of `ALL_EXPERIMENTS`, with the same flags."""
  from experiments import configs
  from experiments.configs import paper000
  for full, fig in zip(paper000.ALL_EXPERIMENTS[1:], ('fig2a', 'fig3a', 'fig4a')):
    table = configs.get(full.name)
    panel = configs.get(full.name.replace('table1', fig))
    assert [r.label for r in panel.runner.runs] == [
        r.label for r in full.runner.runs if r.label.startswith('const_')]
    assert len(panel.runner.runs) == 3 and not panel.published
    assert sorted(r.label for r in table.runner.runs + panel.runner.runs) == sorted(
        r.label for r in full.runner.runs)
    flags = {r.label: r.flags for r in full.runner.runs}
    assert all(r.flags == flags[r.label] for r in panel.runner.runs)
    assert (panel.runner.task, panel.runner.task_flags, panel.runner.total_rounds,
            panel.runner.seeds) == (full.runner.task, full.runner.task_flags,
                                    full.runner.total_rounds, full.runner.seeds)


def test_paper000_step_fractions_follow_from_table5():
  from experiments.configs import paper000
  for exp in paper000.ALL_EXPERIMENTS[1:]:
    runs = {r.label: r.flags for r in exp.runner.runs}
    for pub in exp.published:
      label, _, metric = pub.key.partition('/')
      if metric != 'fraction_sgd_steps':
        continue
      k0, d = runs[label]['local_steps'], runs[label]['local_steps_decay']
      ours = paper000._client_steps(k0, d) / (paper000.ROUNDS * k0)
      assert ours == pytest.approx(pub.value, abs=0.005), (exp.name, label)


def test_paper000_metrics_min_smoothed_train_loss_and_step_fraction():
  loss = [5.0, 4.0, 1.0, 3.0, 2.0, 2.0]
  steps = [10, 9, 8, 7, 6, 5]
  rows = [{'round': i + 1, 'client_work/train/loss': l, 'client_work/local_steps': k}
          for i, (l, k) in enumerate(zip(loss, steps))]
  m = lambda name: reproduce.run_metric(rows, {}, name)
  assert m('min_train_loss_smooth2') == pytest.approx(2.0)   # (3 + 1) / 2 vs (2 + 2) / 2
  assert m('min_train_loss_smooth3') == pytest.approx(2.0)   # (1 + 3 + 2) / 3
  assert m('min_train_loss_smooth200') == pytest.approx(17 / 6)  # fewer rounds: all
  assert m('fraction_sgd_steps') == pytest.approx(45 / 60)
  assert reproduce.run_metric([{'round': 1}], {}, 'fraction_sgd_steps') is None


# --- paper 002 (LocalUpdate): App. C models, App. D tables compared ---------------

def test_paper002_emnist_model_is_mcmahan_cnn():
  import tensorflow as tf
  from experiments.configs import paper002
  from tasks import models
  model_id = paper002.TASK_SETUP['emnist_character'][0]
  assert model_id == 'cnn'
  keras = models.emnist_tff_model(model_id)
  convs = [l for l in keras.layers if isinstance(l, tf.keras.layers.Conv2D)]
  dense = [l for l in keras.layers if isinstance(l, tf.keras.layers.Dense)]
  assert [(c.kernel_size, c.filters) for c in convs] == [((5, 5), 32), ((5, 5), 64)]
  assert sum(isinstance(l, tf.keras.layers.MaxPooling2D) for l in keras.layers) == 2
  assert [d.units for d in dense] == [512, 62]
  assert not any(isinstance(l, tf.keras.layers.Dropout) for l in keras.layers)


def test_paper002_task_setup_is_app_c():
  """M and B of every task (App. C), and Stack Overflow NWP's clients cut to their
  first 128 posts ("we restrict each client to the first 128 posts in their
  history"), which the figure binary builds its tasks with."""
  from experiments.configs import paper002
  from tasks import get_task
  assert {t: setup[1:] for t, setup in paper002.TASK_SETUP.items()} == {
      'emnist_character': (10, 20), 'cifar100_image': (10, 20),
      'shakespeare_character': (10, 4), 'stackoverflow_tag': (50, 16),
      'stackoverflow_word': (50, 16)}
  options = {t: paper002.task_options(t, seed=3) for t in paper002.TASK_SETUP}
  assert {t: (o.batch_size, o.max_client_examples, o.seed) for t, o in options.items()} == {
      'emnist_character': (20, None, 3), 'cifar100_image': (20, None, 3),
      'shakespeare_character': (4, None, 3), 'stackoverflow_tag': (16, None, 3),
      'stackoverflow_word': (16, 128, 3)}
  import dataclasses
  task = get_task('stackoverflow_word', dataclasses.replace(
      options['stackoverflow_word'], use_synthetic_data=True, max_client_examples=2))
  raw = task.train_data.create_tf_dataset_for_client(task.client_ids[0])
  assert sum(1 for _ in raw) == 2  # the cap reaches the client's posts
  assert task.info['max_client_examples'] == 2


def test_paper002_tuned_etas_of_app_d_and_table2_are_compared():
  from experiments import configs
  from experiments.configs import paper002
  exps = configs.all_experiments()
  tables = {'local_update_fig8_emnist': ('emnist_character', 'Table 4'),
            'local_update_fig8_cifar100': ('cifar100_image', 'Table 3'),
            'local_update_fig8_shakespeare': ('shakespeare_character', 'Table 5'),
            'local_update_fig9_so_nwp': ('stackoverflow_word', 'Table 6'),
            'local_update_fig9_so_tp': ('stackoverflow_tag', 'Table 7')}
  for name, (task, table) in tables.items():
    pubs = {p.key: p for p in exps[name].published}
    assert exps[name].runner.flags['tasks'] == task
    assert len(pubs) == len(paper002.TUNED_ETA[task]) + 1
    assert pubs[f'log10_eta.{task}.decay'].value == paper002.DECAY_LR[task][1]
    assert pubs[f'log10_eta.{task}.decay'].ref == 'Table 2'
    assert all(p.ref.endswith(table) for k, p in pubs.items() if not k.endswith('decay'))
    # The smoke run tunes every gamma of the table, so every key is measured.
    smoke_gammas = exps[name].runner.smoke_flags['gammas'].split(',')
    assert {f'log10_eta.{task}.{paper002.gamma_key(float(g))}' for g in smoke_gammas} | {
        f'log10_eta.{task}.decay'} == set(pubs)
  emnist = {p.key: p.value for p in exps['local_update_fig8_emnist'].published}
  assert emnist['log10_eta.emnist_character.1e-1'] == -2           # Table 4, gamma = 0.1
  assert emnist['log10_eta.emnist_character.0'] == -1.5
  assert reproduce.lookup({'log10_eta': {'emnist_character': {'1e-1': -2.0}}},
                          'log10_eta.emnist_character.1e-1') == -2.0
  assert [paper002.gamma_key(g) for g in (0, 1e-3, 0.1, 1, 100, 0.5)] == [
      '0', '1e-3', '1e-1', '1e0', '1e2', '0p5']


# ------------------------------------------------ Reddi et al. 2021, Table 2

REDDI_TABLE2 = {  # task short name -> FedAdagrad, FedAdam, FedYogi, FedAvgM, FedAvg
    'cifar10': (72.1, 77.4, 78.0, 77.4, 72.8),
    'cifar100': (47.9, 52.5, 52.4, 52.4, 44.7),
    'emnist_cr': (85.1, 85.6, 85.5, 85.2, 84.9),
    'shakespeare': (57.5, 57.0, 57.2, 57.3, 56.9),
    'stackoverflow_nwp': (23.8, 25.2, 25.2, 23.8, 19.5),
    'stackoverflow_lr': (67.1, 65.8, 65.9, 36.9, 30.0),
    'emnist_ae': (4.20, 1.01, 0.98, 1.65, 6.47),
}
REDDI_METHODS = ('fedadagrad', 'fedadam', 'fedyogi', 'fedavgm', 'fedavg')


def _reddi_plan(task, method):
  from experiments import configs
  exp = configs.get(f'fedopt_baselines_{task}_{method}')
  (plan,) = reproduce.trainer_plans(exp, 'full')
  return exp, plan


def test_reddi_table2_one_experiment_per_task_and_method():
  from experiments import configs
  names = [n for n in configs.all_experiments() if n.startswith('fedopt_baselines_')]
  assert len(names) == 35
  for task, values in REDDI_TABLE2.items():
    for method, value in zip(REDDI_METHODS, values):
      exp, plan = _reddi_plan(task, method)
      (pub,) = exp.published
      if task == 'emnist_ae':  # MSE x 1000 in the paper; stored as the MSE
        assert pub.key == f'{method}/mean_mean_squared_error_last100'
        assert pub.value == pytest.approx(value / 1000) and 'lower is better' in pub.label
      else:
        assert pub.key == f'{method}/mean_accuracy_last100'
        assert pub.value == pytest.approx(value / 100)
      assert plan.flags['algorithm'] == 'fedavg' and plan.flags['client_epochs_per_round'] == 1


def test_reddi_tuned_hyperparameters_and_settings():
  f = _reddi_plan('cifar100', 'fedyogi')[1].flags
  assert (f['task'], f['model'], f['client_batch_size'], f['clients_per_round'],
          f['total_rounds']) == ('cifar100_image', 'resnet18_gn2', 20, 10, 4000)
  assert (f['client_learning_rate'], f['server_learning_rate'], f['server_epsilon'],
          f['server_beta_2'], f['server_initial_accumulator']) == pytest.approx(
              (10 ** -1.5, 1.0, 0.1, 0.999, 0.0))
  f = _reddi_plan('emnist_ae', 'fedadagrad')[1].flags
  assert (f['task'], f['model'], f['total_rounds']) == ('emnist_autoencoder', 'tff_ae', 3000)
  assert (f['client_learning_rate'], f['server_learning_rate'],
          f['server_epsilon']) == pytest.approx((10 ** 1.5, 10 ** -1.5, 1e-3))
  f = _reddi_plan('cifar10', 'fedadam')[1].flags
  assert (f['task'], f['dirichlet_alpha']) == ('cifar10_image', 0.1)
  assert f['server_learning_rate'] == pytest.approx(0.01)
  f = _reddi_plan('stackoverflow_nwp', 'fedavgm')[1].flags
  assert (f['server_optimizer'], f['server_momentum'], f['clients_per_round'],
          f['client_batch_size']) == ('sgdm', 0.9, 50, 16)


@pytest.mark.parametrize('task', ['stackoverflow_nwp', 'stackoverflow_lr'])
def test_reddi_stackoverflow_keeps_each_clients_first_1000_examples(task):
  """google-research's preprocessing: `dataset.take(1000).shuffle(...)`, a fixed
  subset (--max_client_examples), not a fresh one each round."""
  exp, plan = _reddi_plan(task, 'fedadam')
  assert plan.flags['max_client_examples'] == 1000
  assert 'max_elements_per_user' not in plan.flags
  assert '--max_client_examples=1000' in plan.command('out')
  options, _, _ = reproduce.validate_plan(plan)
  assert options.max_client_examples == 1000 and options.max_elements_per_user is None
  # SO LR: the code's bag of words (a mean over all words), not TFF's.
  assert plan.flags['model'] == {'stackoverflow_nwp': 'lstm', 'stackoverflow_lr': 'logreg_code'}[task]


@pytest.mark.parametrize('task,tokens', [('shakespeare', True), ('stackoverflow_nwp', True),
                                         ('stackoverflow_lr', False), ('emnist_cr', False),
                                         ('cifar100', False)])
def test_reddi_weights_clients_by_tokens_where_the_code_does(task, tokens):
  """google-research's federated_shakespeare.py / federated_stackoverflow.py pass
  client_weight_fn = num_tokens; the other tasks weight by examples."""
  for plan in _reddi_plan(task, 'fedadam')[1:]:
    assert plan.flags.get('token_weighting', False) is tokens
    reproduce.validate_plan(plan)


def test_reddi_fedadagrad_epsilon_is_outside_the_square_root():
  """The tuned eps of every FedAdagrad run means Keras's lr g / (sqrt(v) + eps):
  one coordinate, one step from v = 0 with g = eps moves lr / 2."""
  import tensorflow as tf
  for task in REDDI_TABLE2:
    _, plan = _reddi_plan(task, 'fedadagrad')
    _, hp, _ = reproduce.validate_plan(plan)
    spec = groups.optimizer_spec(hp, 'server')
    eps, lr = spec.get('epsilon'), spec.learning_rate
    opt = spec.build()
    state = opt.initialize([tf.TensorSpec([1], tf.float32)])
    _, w = opt.next(state, [tf.zeros([1])], [tf.fill([1], eps)])
    assert float(w[0][0]) == pytest.approx(-lr / 2, rel=1e-5), task


def test_reddi_autoencoder_metric_is_the_mean_mse_of_the_last_rounds():
  rows = [{'round': r, 'eval/mean_squared_error': v, 'eval/loss': 9.0}
          for r, v in ((100, 0.5), (200, 0.004), (300, 0.002))]
  assert reproduce.run_metric(rows, {}, 'mean_mean_squared_error_last150') == (
      pytest.approx(0.003))
  assert reproduce.run_metric(_rows(), {}, 'mean_mean_squared_error_last100') is None
  tag_rows = [{'round': 10, 'eval/precision': 0.1, 'eval/recall_at_5': 0.6}]
  assert reproduce.run_metric(tag_rows, {}, 'mean_accuracy_last100') == 0.6


def test_reddi_list_shows_published_values():
  from experiments import configs
  lines = reproduce.list_lines({n: e for n, e in configs.all_experiments().items()
                                if n.startswith('fedopt_baselines_cifar10_')})
  assert len(lines) == 5 and 'published: 0.78' in lines[2]


# ------------------------------------------------------------------ paper 001

def test_paper001_cifar10_tuned_sgd_runs_the_step_schedule():
  from experiments.configs import paper001
  from tff_algos.algorithms import registry
  from tff_algos.flags import algorithm_flags
  from tff_algos.flags.algorithm_flags import HParams
  plans = {p.label: p for p in reproduce.trainer_plans(paper001.CIFAR10, 'full')}
  assert '--client_lr_milestones=150,200' in plans['sgd'].command('out')
  assert plans['sgd'].flags['client_learning_rate'] == 0.2
  _, hp, _ = reproduce.validate_plan(plans['sgd'])
  assert list(hp.client_lr_milestones) == ['150', '200']
  with pytest.raises(ValueError, match='client_lr_milestones'):
    algorithm_flags.check('fedavg', HParams(client_lr_milestones=['150']))


def test_paper001_cifar10_commands_are_the_papers_three_lines():
  """Every setting of Fig. 2's CIFAR-10 runs (docs/papers/paper001.md): tuned
  SGD, SGD on the other schedule, and Nastya+Adam on that schedule; LeNet-5,
  B = 1024, one node, one RR epoch a round, 250 epochs, Adam 0.01 (PyTorch's
  constants), a constant 0.2 standing in for the lost decreasing schedule."""
  from experiments.configs import paper001
  common = ('--task=cifar10_lenet --model=lenet5 --num_clients=1 --partition=iid '
            '--algorithm={} --total_rounds=250 --clients_per_round=1 --rounds_per_eval=5 '
            '--seed=0 --root_output_dir=out --experiment_name={}_seed0')
  head = 'python -m experiments.train --client_batch_size=1024 --shuffle=rr --client_learning_rate=0.2 '
  plans = reproduce.trainer_plans(paper001.CIFAR10, 'full')
  assert [p.command('out') for p in plans] == [
      head + '--client_lr_milestones=150,200 ' + common.format('fedrr', 'sgd'),
      head + common.format('fedrr', 'sgd_decreasing'),
      head + ('--server_optimizer=adam --server_learning_rate=0.01 --server_beta_1=0.9 '
              '--server_beta_2=0.999 --server_epsilon=1e-08 ') + common.format(
                  'nastya', 'nastya_adam')]
  for plan in plans:
    reproduce.validate_plan(plan)  # every flag a trainer flag, every value valid


def test_paper001_mushrooms_runs_the_binarys_single_node_setting():
  """Fig. 2's mushrooms experiment: one node, B = 1, gamma = 1e-4, 100 rounds, and
  the binary's defaults for what the config leaves (lambda = L0/n, the four
  eta = m/L runs, the fixed runs, RR passes, Adam's 0.05)."""
  from experiments.configs import paper001
  argv = reproduce.binary_argv(paper001.MUSHROOMS, 'full', 'out')
  assert argv[1:] == ['-m', 'experiments.nastya', '--libsvm_path=data/mushrooms',
                      '--settings=single', '--rounds=100', '--batch_size=1',
                      '--gamma=0.0001', '--output_dir=out', '--progress=false',
                      '--backend=inprocess']
  script = ('import json; from absl import flags; import experiments.nastya as n; '
            'F = flags.FLAGS; print(json.dumps(dict(fixed=list(n.FIXED_RUNS), **{k: F[k].default '
            'for k in ("l2_reg", "eta_multipliers", "adam_lr", "shuffle", "runs", "seed")})))')
  res = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert json.loads(res.stdout.strip().splitlines()[-1]) == dict(
      fixed=['fedrr', 'local_sgd_wr', 'nastya_adam', 'nastya_adaptive'], l2_reg=None,
      eta_multipliers=['0.25', '0.5', '1', '1.5'], adam_lr=0.05, shuffle='rr', runs=None,
      seed=0)


# -- paper 003 (FedDyn): every setting of Tables 1, 2, 4, 5 -----------------------

def _paper003_plans(name):
  from experiments import configs
  return {p.label: p.flags for p in reproduce.trainer_plans(configs.get(name), 'full')}


# (experiment, target accuracy %, published models transmitted of FedDyn,
# SCAFFOLD, FedAvg, FedProx at that target; None: printed "N+"), read off the paper.
PAPER003_SPOT_CHECKS = [
    ('feddyn_cifar10_p10_iid', 84.5, (637, 1852, None, None)),
    ('feddyn_cifar100_p10_iid_500dev', 38.3, (477, 1408, 1997, 1974)),
    ('feddyn_cifar10_p10_dir03_1000dev', 70.6, (350, 2138, 1962, 1517)),
    ('feddyn_cifar100_p100_iid', 39.4, (55, 172, None, 741)),
    ('feddyn_shakespeare_p100_iid', 45.4, (28, 64, 59, 56)),
    ('feddyn_shakespeare_p10_iid', 46.9, (63, 94, 138, 190)),
    ('feddyn_shakespeare_p1_iid', 42.0, (148, 342, 149, 142)),
    ('feddyn_shakespeare_p100_noniid', 47.3, (33, 70, 134, None)),
    ('feddyn_emnistl_p10_dir06', 94.9, (192, 296, 306, None)),
    ('feddyn_cifar100_p10_dir03_unbalanced', 47.3, (234, 942, 871, None)),
    ('feddyn_mnist_p1_dir03', 98.2, (521, 954, 951, 974)),
    ('feddyn_cifar100_p1_dir06', 35.6, (342, 1876, 317, 342)),
]


def test_paper003_every_setting_of_tables_1_2_4_5_is_an_experiment():
  from experiments import configs
  # The figures' experiments (paper003_figures: '_fig' in the name) aside.
  names = [n for n in configs.all_experiments() if n.startswith('feddyn_')
           and 'synthetic' not in n and '_fig' not in n]
  assert len(names) == 50
  tables = {}
  for name in names:
    exp = configs.get(name)
    for table in re.findall(r'Table (\d)', exp.ref):
      tables[table] = tables.get(table, 0) + 1
  # Table 1: 8 settings; Table 2: 24 (10 % CIFAR IID/Dir .3 are Table 1's);
  # Table 4: 8 (4 balanced = Table 1's); Table 5: 14.
  assert tables == {'1': 8, '2': 24, '4': 8, '5': 14}
  for name, target, values in PAPER003_SPOT_CHECKS:
    published = {p.key: p.value for p in configs.get(name).published}
    for method, value in zip(('feddyn', 'scaffold', 'fedavg', 'fedprox'), values):
      key = f'{method}/models_to{target / 100:.4g}'
      assert published.get(key) == value, (name, key, published.get(key))


def test_paper003_evaluates_the_average_of_all_device_models():
  from experiments import configs
  for name in ('feddyn_cifar10_p10_iid', 'feddyn_shakespeare_p1_noniid',
               'feddyn_mnist_p100_dir06'):
    plans = _paper003_plans(name)
    assert sorted(plans) == ['fedavg', 'feddyn', 'fedprox', 'scaffold']
    assert all(flags['report_device_average'] for flags in plans.values()), name
  assert all(plan.flags['report_device_average'] for plan in reproduce.trainer_plans(
      configs.get('feddyn_mnist_p100_dir06'), 'smoke'))


@pytest.mark.parametrize('name,split,alpha,lr_decay,rounds', [
    ('feddyn_shakespeare_p100_noniid', 'natural', 0.009, 1.0, 150),
    ('feddyn_shakespeare_p100_iid', 'iid', 0.009, 1.0, 150),
    ('feddyn_shakespeare_p10_iid', 'iid', 0.015, 1.0, 250),
    ('feddyn_shakespeare_p1_noniid', 'natural', 0.001, 0.998, 250),
])
def test_paper003_shakespeare_runs_the_papers_samples_and_lstm(name, split, alpha,
                                                               lr_decay, rounds):
  plans = _paper003_plans(name)
  for label, flags in plans.items():
    assert flags['task'] == 'shakespeare_003' and flags['model'] == 'lstm100', label
    assert flags['partition'] == split and flags['num_clients'] == 100
    assert flags['client_batch_size'] == 100 and flags['client_learning_rate'] == 1.0
    assert flags['client_weight_decay'] == 1e-4 and flags['total_rounds'] == rounds
    assert flags.get('client_lr_decay', 1.0) == lr_decay
  assert plans['feddyn']['feddyn_alpha'] == alpha
  assert plans['feddyn']['client_epochs_per_round'] == 5
  assert plans['scaffold']['local_steps'] == 100      # 5 epochs x 2000 / 100
  assert plans['fedprox']['prox_mu'] == 1e-4


@pytest.mark.parametrize('name,alpha,epochs,scaffold_k,mu', [
    ('feddyn_cifar100_p10_iid_500dev', 0.01, 2, 4, 1e-4),        # App. A.2, 500 devices
    ('feddyn_cifar100_p10_dir03_500dev', 0.01, 2, 4, 1e-4),
    ('feddyn_cifar100_p10_iid_unbalanced', 0.1, 2, 20, 1e-4),    # unbalanced CIFAR-100
    ('feddyn_cifar10_p10_iid', 0.1, 5, 50, 1e-4),                # App. A.3: best alpha
    ('feddyn_mnist_p10_iid', 0.03, 50, 600, 1e-4),               # MNIST 10 % IID
    ('feddyn_mnist_p100_dir03', 0.01, 50, 600, 1e-4),
    ('feddyn_emnistl_p100_dir06', 0.005, 50, 500, 1e-4),
    ('feddyn_emnistl_p1_dir06', 0.001, 50, 500, 1e-4),
    ('feddyn_emnistl_p10_dir03', 0.01, 50, 500, 1e-4),
    ('feddyn_emnistl_p1_iid', 0.003, 50, 500, 1e-4),
])
def test_paper003_hyperparameters_per_setting(name, alpha, epochs, scaffold_k, mu):
  plans = _paper003_plans(name)
  assert plans['feddyn']['feddyn_alpha'] == alpha
  assert plans['feddyn']['client_epochs_per_round'] == epochs
  assert plans['scaffold']['local_steps'] == scaffold_k
  assert plans['fedprox']['prox_mu'] == mu
  assert all(flags['clip_norm'] == 10.0 for flags in plans.values())
  assert plans['scaffold']['scaffold_reference_conventions']
  assert plans['scaffold']['server_learning_rate'] == 1.0


PAPER003_DATA = {  # dataset in the name -> (task, model, batch, weight decay)
    'cifar10': ('cifar10', 'cnn003_text', 50, 1e-3),
    'cifar100': ('cifar100_split', 'cnn003_text', 50, 1e-3),
    'mnist': ('mnist', 'mlp_200_200', 50, 1e-4), 'emnistl': ('emnist_letters10', 'mlp_100_100',
                                                             50, 1e-4),
    'shakespeare': ('shakespeare_003', 'lstm100', 100, 1e-4)}


def _paper003_names():
  try:
    from experiments.configs import paper003
    # The settings of Tables 1, 2, 4, 5 (trainer runs); Table 6 is a binary with
    # its own tests (tests/test_table6.py).
    return [e.name for e in paper003.EXPERIMENTS if isinstance(e.runner, base.TrainerRuns)]
  except Exception:  # reported by test_every_config_is_valid
    return []


@pytest.mark.parametrize('name', _paper003_names())
def test_paper003_each_setting_runs_its_data_split_and_cohort(name):
  # feddyn_<dataset>_p<percent>_<split>[_<N>dev][_unbalanced], read off the name.
  m = re.fullmatch(r'feddyn_([a-z0-9]+)_p(\d+)_(iid|dir06|dir03|noniid)(?:_(\d+)dev)?'
                   r'(_unbalanced)?', name)
  assert m, name
  dataset, percent, split, devices, unbalanced = m.groups()
  devices = int(devices or 100)
  task, model, batch, decay = PAPER003_DATA[dataset]
  plans = _paper003_plans(name)
  assert sorted(plans) == ['fedavg', 'feddyn', 'fedprox', 'scaffold']
  for flags in plans.values():
    assert (flags['task'], flags['model'], flags['client_batch_size']) == (task, model, batch)
    assert flags['num_clients'] == devices
    assert flags['clients_per_round'] == max(1, round(int(percent) / 100 * devices))
    # App. B.1 and the authors' code: each device joins with probability p.
    assert flags.get('participation_prob') == (None if percent == '100' else int(percent) / 100)
    assert flags['client_weight_decay'] == decay and flags['clip_norm'] == 10.0
    assert flags['report_device_average']
    if dataset == 'shakespeare':
      assert flags['partition'] == {'iid': 'iid', 'noniid': 'natural'}[split]
    elif split == 'iid':
      assert flags['partition'] == 'iid' and 'dirichlet_alpha' not in flags
    else:
      assert flags['partition'] == 'dirichlet'
      assert flags['dirichlet_alpha'] == {'dir06': 0.6, 'dir03': 0.3}[split]
    assert flags.get('unbalanced_sigma', 0.0) == (0.3 if unbalanced else 0.0)


def test_an_experiment_binarys_user_error_is_reproduces_one_line(tmp_path):
  """An experiment run by its own binary (Nastya's mushrooms, the paper-002
  figures) whose input is missing ends reproduce with that binary's one
  `error:` line and its offline way, not a RuntimeError traceback; the binary
  writes under an absolute output directory (a relative one landed under the
  repository's root when reproduce ran elsewhere)."""
  from experiments import reproduce
  from experiments.configs import base
  from tff_algos.errors import UserError
  missing = tmp_path / 'mushrooms'
  exp = base.Experiment(
      name='nastya_test', paper='001', ref='-', description='-',
      runner=base.Binary('experiments.nastya', dict(libsvm_path=str(missing), rounds=1),
                         dict(rounds=1)))
  out_dir = tmp_path / 'out'
  out_dir.mkdir()
  with pytest.raises(UserError) as raised:
    reproduce._run_binary(exp, 'full', str(out_dir))  # pylint: disable=protected-access
  said = str(raised.value)
  assert said.startswith(f"experiments.nastya: --libsvm_path: cannot read '{missing}'"), said
  assert said.endswith('or run --scale=smoke (the embedded data: a check of the pipeline)')
  assert '\n' not in said
  argv = reproduce.binary_argv(exp, 'full', 'relative/out')
  assert '--output_dir=relative/out' in argv  # as printed by --print_commands


def test_an_experiment_binary_writes_where_reproduce_runs(tmp_path, monkeypatch):
  """Run from another directory than the repository's root, with a relative
  --root_output_dir, the binary's files (figure1.png, curves.csv) land in the
  experiment's directory under it (they landed under the root)."""
  from experiments import configs
  from experiments import reproduce
  monkeypatch.chdir(tmp_path)
  os.makedirs('rel')
  exp = configs.get('decaying_k_quadratic_fig1')
  result = reproduce._run_binary(exp, 'smoke', 'rel')  # pylint: disable=protected-access
  assert 'json' in result
  assert {'figure1.png', 'curves.csv', 'stdout.txt'} <= set(os.listdir(tmp_path / 'rel'))


# ------------------------------------------ reproduce's command line, end to end

def _reproduce(*argv, cwd, timeout=120):
  return run_binary('reproduce', *argv, cwd=cwd, timeout=timeout)




def test_reproduce_refuses_trainer_flags_it_does_not_pass_on(tmp_path):
  """`--total_rounds=1 --client_learning_rate=0.5 --experiment_name=zzz` ran the
  config's 3 rounds with its own values, exit 0: the trainer's flags that
  reproduce defines (for --help) were silently ignored."""
  res = _reproduce('--experiment=fedopt_baselines_emnist_cr_fedavg', '--scale=smoke',
                   '--total_rounds=1', '--client_learning_rate=0.5', '--experiment_name=zzz',
                   cwd=tmp_path)
  said = assert_refused(res, '--client_learning_rate, --experiment_name, --total_rounds',
                        "the paper's", 'python -m experiments.train', '--print_commands')
  for name in reproduce.PASSED_THROUGH:  # what it does take, named
    assert f'--{name}' in said
  assert os.listdir(tmp_path) == []  # no runs/ written
  # Only the trainer's flags that no run gets: the runtime's and reproduce's own
  # are no trainer flags, and every trainer flag it passes on is one.
  from absl import flags
  trainer = {f.name for f in flags.FLAGS.get_flags_for_module('experiments.lib.flags')}
  runtime = {f.name for f in flags.FLAGS.get_flags_for_module('experiments.lib.runtime_flags')}
  assert set(reproduce.PASSED_THROUGH) <= trainer | runtime
  assert {'cache_dir', 'root_output_dir', 'progress', 'restart'} == (
      set(reproduce.PASSED_THROUGH) & trainer)


def test_print_commands_repeat_every_value_reproduce_passes_on(tmp_path):
  """The printed trainer commands left out --cache_dir (and the other values
  reproduce gives every run), so they were not the runs reproduce ran; every
  flag reproduce takes is accepted."""
  res = _reproduce('--experiment=fedopt_baselines_emnist_cr_fedavg', '--scale=full',
                   '--print_commands', '--cache_dir=/data/tff', '--noprogress', '--restart',
                   '--backend=inprocess', '--concurrent_clients=2', '--compile_local_loop',
                   f'--root_output_dir={tmp_path}/out', cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  (line,) = [l for l in res.stdout.splitlines() if l.startswith('python -m')]
  for arg in ('--cache_dir=/data/tff', '--progress=false', '--restart=true',
              '--concurrent_clients=2', '--compile_local_loop=true', '--task=emnist_character',
              f'--root_output_dir={tmp_path}/out/full/fedopt_baselines_emnist_cr_fedavg/runs'):
    assert f' {arg} ' in f'{line} ', (arg, line)
  assert '--backend' not in line  # its default: nothing to repeat
  assert not (tmp_path / 'out').exists()
  # A binary's command likewise (--workers: the runtime's).
  res = _reproduce('--experiment=local_update_fig8_emnist', '--scale=full', '--print_commands',
                   '--cache_dir=cache', '--workers=2', cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  (line,) = [l for l in res.stdout.splitlines() if l.startswith('python -m')]
  assert f'--cache_dir={tmp_path}/cache ' in line and '--workers=2' in line, line


def test_reproduce_passes_cache_dir_to_binaries_that_read_it(tmp_path):
  """`reproduce --experiment=local_update_fig8_emnist --cache_dir=X` looked in
  ~/.tff, and the missing-data error offered --use_synthetic_data, which
  reproduce does not take. A relative --cache_dir is reproduce's working
  directory's (the binary runs from the repository's root)."""
  res = _reproduce('--experiment=local_update_fig8_emnist', '--scale=full', '--cache_dir=cache',
                   '--root_output_dir=out', cwd=tmp_path)
  said = assert_refused(res, f'{tmp_path}/cache/emnist_all.sqlite', '--cache_dir',
                        '--scale=smoke', before_tensorflow=False)
  assert '--use_synthetic_data' not in said
  assert not (tmp_path / 'out').exists()
  from experiments import configs
  for module in {e.runner.module for e in configs.all_experiments().values()
                 if isinstance(e.runner, base.Binary)}:
    assert ('cache_dir' in _binary_flags(module)) == (module in reproduce.BINARY_CACHE_DIR), (
        module)


def test_reproduce_restart_starts_a_different_run_over(tmp_path):
  """The refusal of a run directory that holds another run said "pass
  --restart", which reproduce ignored: the same refusal came back forever."""
  run = tmp_path / 'smoke' / 'fedopt_baselines_emnist_cr_fedavg' / 'runs' / 'fedavg_seed0'
  run.mkdir(parents=True)
  (run / 'run_identity.json').write_text('{"task": "another"}')
  args = ('--experiment=fedopt_baselines_emnist_cr_fedavg', f'--root_output_dir={tmp_path}',
          '--noprogress')
  assert_refused(_reproduce(*args, cwd=tmp_path), 'holds a different run',
                 'choose another --root_output_dir', 'pass --restart', before_tensorflow=False)
  res = _reproduce(*args, '--restart', cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  assert '--restart removed the earlier run' in res.stderr
  assert json.loads((run / 'run_identity.json').read_text())['task'] == 'digits'


def test_reproduce_restart_of_a_binary_experiment_says_what_to_do(tmp_path, monkeypatch):
  """Binaries without a --restart (all but local_update_decay): reproduce
  refuses it for them, and a binary's own "pass --restart" is said as
  reproduce's remedy. local_update_decay gets it passed on."""
  res = _reproduce('--experiment=nastya_mushrooms_fig2', '--restart',
                   '--root_output_dir=out', cwd=tmp_path)
  assert_refused(res, '--restart', 'experiments.nastya',
                 'remove out/smoke/nastya_mushrooms_fig2', before_tensorflow=False)
  assert not (tmp_path / 'out').exists()
  from absl import flags
  from experiments import configs
  exp = configs.get('local_update_fig8_emnist')
  assert not any(a.startswith('--restart') for a in reproduce.binary_argv(exp, 'smoke', 'o'))
  flags.FLAGS['restart'].value = True
  try:
    argv = reproduce.binary_argv(exp, 'smoke', 'o')
  finally:
    flags.FLAGS['restart'].value = False
  assert '--restart=true' in argv, argv
  from tff_algos.training import run_dir
  said = f'error: {tmp_path}/x holds a different run (differs in: seed); {run_dir.RESTART_FIX}'
  monkeypatch.setattr(reproduce.subprocess, 'run', lambda *a, **k: subprocess.CompletedProcess(
      a, 2, '', said + '\n'))
  exp = base.Experiment(name='nastya_test', paper='-', ref='-', description='-',
                        runner=base.Binary('experiments.nastya', {}, {}))
  with pytest.raises(reproduce.UserError) as raised:
    reproduce._run_binary(exp, 'smoke', str(tmp_path))  # pylint: disable=protected-access
  assert '--restart' not in str(raised.value)
  assert f'remove {tmp_path}' in str(raised.value), raised.value


@pytest.mark.parametrize('argv,fragment', [
    (['--list', '--print_commands'], '--list and --print_commands'),
    (['--list', '--report'], '--list and --report'),
    (['--report', '--print_commands', '--experiment=nastya_mushrooms_fig2'],
     '--report and --print_commands'),
    (['--markdown'], '--markdown formats --list only'),
])
def test_reproduce_refuses_two_modes_at_once(tmp_path, argv, fragment):
  """`--list --print_commands` listed, its --print_commands ignored (and so on)."""
  res = _reproduce(*argv, f'--root_output_dir={tmp_path}/out', cwd=tmp_path)
  assert_refused(res, fragment)
  assert res.stdout.strip() == 'TF loaded: False' and not (tmp_path / 'out').exists()


@pytest.mark.parametrize('where', ['missing', 'empty', 'too_deep'])
def test_report_without_results_is_refused(tmp_path, where):
  """A mistyped --root_output_dir (or one level too deep) was created and given
  an all-"not run" report.md, exit 0."""
  runs = tmp_path / 'runs'
  result = runs / 'smoke' / 'nastya_mushrooms_fig2' / 'result.json'
  result.parent.mkdir(parents=True)
  result.write_text('{"measured": {}, "rounds": {"binary": 3}}')
  root = {'missing': tmp_path / 'rnus', 'empty': tmp_path / 'empty',
          'too_deep': runs / 'smoke'}[where]
  if where == 'empty':
    root.mkdir()
  res = _reproduce('--report', f'--root_output_dir={root}', cwd=tmp_path)
  assert_refused(res, f'no results under {root}', f'{root}/{{full,smoke}}/EXPERIMENT/result.json',
                 '--root_output_dir', before_tensorflow=False)
  assert root.exists() == (where != 'missing')
  assert not (root / 'report.md').exists()


def test_report_of_one_experiment_shows_that_experiment(tmp_path):
  """`--report --experiment=X` ignored X; now its table alone, in its own file
  (report.md, every experiment's, stays as it was)."""
  pub = {'fedopt_baselines_emnist_cr_fedavg': 'fedavg/mean_accuracy_last100',
         'fedopt_baselines_emnist_cr_fedadam': 'fedadam/mean_accuracy_last100'}
  for name, key in pub.items():
    path = tmp_path / 'smoke' / name / 'result.json'
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({'measured': {key: 0.5}, 'rounds': {'a': 3}}))
  res = _reproduce('--report', '--experiment=fedopt_baselines_emnist_cr_fedavg',
                   f'--root_output_dir={tmp_path}', cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  text = (tmp_path / 'report_fedopt_baselines_emnist_cr_fedavg.md').read_text()
  assert '| fedopt_baselines_emnist_cr_fedavg |' in text and 'fedadam' not in text
  assert '0 of 1 experiments run at full scale' in text
  assert not (tmp_path / 'report.md').exists()
  res = _reproduce('--report', '--experiment=fedopt_baselines_cifar10_fedavg',
                   f'--root_output_dir={tmp_path}', cwd=tmp_path)
  assert_refused(res, 'no result of fedopt_baselines_cifar10_fedavg',
                 '--experiment=fedopt_baselines_cifar10_fedavg first', before_tensorflow=False)
