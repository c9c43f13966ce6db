"""Paper 003 Table 6: lanes, participation, the loss metric, the grid, the binary."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from experiments.configs import paper003
from experiments.lib import table6_grid
from paths import ROOT
from tasks import feddyn_data
from tasks import stacked_logistic
from tasks.registry import TaskOptions
from tff_algos.algorithms import feddyn, fedopt, fedprox, scaffold
from tff_algos.core import lanes as lanes_lib
from tff_algos.core import optimizers
from tff_algos.core.lanes import Lanes
from tff_algos import training
from tff_algos.training import sampling, targets as metrics_tables



# ------------------------------------------------------------------ Lanes


def test_lanes_shape_and_all_lane_comparisons():
  lr = Lanes([1.0, 0.1])
  assert lr.shape == (2, 1, 1) and lr.dtype == np.float32
  assert lr > 0 and lr >= 0.1 and not lr > 0.5 and not lr < 0.5
  assert lr.values == [1.0, pytest.approx(0.1)]
  with pytest.raises(ValueError):
    Lanes([])


def test_clip_by_lane_norm_is_global_norm_clipping_of_each_lane():
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=(3, 4, 2)).astype(np.float32) * s for s in (1.0, 10.0)]
  grads[0][1] *= 0.01  # lane 1 small: not clipped
  grads[1][1] *= 0.01
  clipped = lanes_lib.clip_by_lane_norm([tf.constant(g) for g in grads], Lanes([2.0] * 3))
  for lane in range(3):
    want, _ = tf.clip_by_global_norm([tf.constant(g[lane]) for g in grads], 2.0)
    for got, w in zip(clipped, want):
      np.testing.assert_allclose(got[lane], w, rtol=1e-6, atol=1e-7)


def test_stacked_model_lane_gradient_is_the_single_model_gradient():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(7, 30)).astype(np.float32)
  y = rng.integers(0, 5, 7).astype(np.int32)
  model = stacked_logistic.StackedLogisticModel(2, 30, 5)
  model.trainable_variables[0].assign(rng.normal(size=(2, 30, 5)).astype(np.float32))
  with tf.GradientTape() as tape:
    loss = model.forward_pass(dict(x=x, y=y)).loss
  grads = tape.gradient(loss, model.trainable_variables)
  for lane in range(2):
    kernel = tf.Variable(model.trainable_variables[0][lane])
    bias = tf.Variable(tf.zeros(5))
    with tf.GradientTape() as tape:
      single = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          y, x @ kernel + bias))
    want = tape.gradient(single, [kernel, bias])
    np.testing.assert_allclose(grads[0][lane], want[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[1][lane, 0], want[1], rtol=1e-5, atol=1e-7)


def test_data_group_lane_gradient_is_its_datasets_single_model_gradient():
  # 2 data groups x 3 configurations: lane g * 3 + c sees dataset g only.
  rng = np.random.default_rng(2)
  x = rng.normal(size=(6, 2, 30)).astype(np.float32)   # [B, G, d]
  y = rng.integers(0, 5, (6, 2)).astype(np.int32)      # [B, G]
  model = stacked_logistic.StackedLogisticModel(6, 30, 5, data_groups=2)
  model.trainable_variables[0].assign(rng.normal(size=(6, 30, 5)).astype(np.float32))
  model.trainable_variables[1].assign(rng.normal(size=(6, 1, 5)).astype(np.float32))
  with tf.GradientTape() as tape:
    loss = model.forward_pass(dict(x=x, y=y)).loss
  grads = tape.gradient(loss, model.trainable_variables)
  for lane in range(6):
    group = lane // 3
    kernel = tf.Variable(model.trainable_variables[0][lane])
    bias = tf.Variable(model.trainable_variables[1][lane, 0])
    with tf.GradientTape() as tape:
      single = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          y[:, group], x[:, group] @ kernel + bias))
    want = tape.gradient(single, [kernel, bias])
    np.testing.assert_allclose(grads[0][lane], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[1][lane, 0], want[1], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='data groups'):
    stacked_logistic.StackedLogisticModel(5, 30, 5, data_groups=2)


def test_group_client_data_keeps_each_datasets_examples_in_order():
  xs = [[np.full((3, 2), 10 * g + k, np.float32) for k in range(2)] for g in range(3)]
  ys = [[np.arange(3, dtype=np.int32) + 100 * g for _ in range(2)] for g in range(3)]
  data = stacked_logistic.group_client_data(xs, ys)
  client = list(data.create_tf_dataset_for_client(data.client_ids[1]).as_numpy_iterator())
  assert len(client) == 3
  np.testing.assert_array_equal(client[2]['x'][:, 0], [1, 11, 21])   # dataset g's client 1
  np.testing.assert_array_equal(client[2]['y'], [2, 102, 202])
  with pytest.raises(ValueError, match='equal client sizes'):
    stacked_logistic.group_client_data([xs[0], [x[:2] for x in xs[1]]], [ys[0], ys[1]])


def test_settings_with_equal_device_sizes_share_one_run():
  groups = table6_grid.data_groups(('homogeneous', 'type1', 'type2', 'type3'), seed=0)
  assert groups == [('homogeneous', 'type1', 'type2'), ('type3',)]


# ------------------------------------------------------------ participation


def test_participation_each_client_with_probability_p_redrawn_if_none():
  ids = [str(i) for i in range(20)]
  draws = [sampling.sample_participants(ids, 0.1, 3, t) for t in range(2000)]
  assert all(draws)  # never empty
  assert draws[5] == sampling.sample_participants(ids, 0.1, 3, 5)  # pure in (seed, t)
  assert draws[5] != sampling.sample_participants(ids, 0.1, 4, 5) or \
      draws[6] != sampling.sample_participants(ids, 0.1, 4, 6)
  # E|S| given non-empty: 20 * 0.1 / (1 - 0.9^20) = 2.28
  assert np.mean([len(d) for d in draws]) == pytest.approx(2.28, rel=0.05)
  counts = np.bincount([int(c) for d in draws for c in d], minlength=20)
  assert counts.min() > 0.6 * counts.mean()  # every client takes part
  assert len(sampling.sample_participants(ids, 1e-6, 0, 0)) >= 1


def test_participation_option_defaults_to_the_fixed_cohort():
  ids = [str(i) for i in range(20)]
  fixed = training.RunConfig(total_rounds=1, clients_per_round=3, seed=2)
  assert sampling.draw_cohort(ids, fixed, 7) == sampling.sample_clients(ids, 3, 2, 7)
  bern = dataclasses.replace(fixed, participation_prob=0.3)
  assert sampling.draw_cohort(ids, bern, 7) == sampling.sample_participants(ids, 0.3, 2, 7)
  with pytest.raises(ValueError, match='participation_prob'):
    training.RunConfig(total_rounds=1, clients_per_round=1, participation_prob=1.5)


# ------------------------------------------------------------------ metric


def test_models_to_loss_target_counts_rounds_times_models_per_round():
  losses = [1.0, 0.5, float('nan'), 0.2, 0.1]
  assert metrics_tables.models_to_loss_target(losses, 0.2, 1) == 4
  assert metrics_tables.models_to_loss_target(losses, 0.2, 2) == 8  # SCAFFOLD
  assert metrics_tables.models_to_loss_target(losses, 1.0, 1) == 1
  assert metrics_tables.models_to_loss_target(losses, 0.05, 1) is None
  with pytest.raises(ValueError):
    metrics_tables.models_to_loss_target(losses, 0.1, 0)


def test_search_keeps_the_first_configuration_to_reach_each_target():
  search = table6_grid.Search(targets=dict(a=0.5, b=0.1), rounds=100)
  configs = [dict(lr=1.0), dict(lr=0.1)]
  # Said per target (the binary printed the dicts: '{} ({})' before any hit).
  assert search.describe() == 'a: not reached in 100 rounds; b: not reached in 100 rounds'
  search.record(3, np.array([0.7, 0.4]), configs, 10)
  assert search.describe() == 'a: round 3 (lr=0.1, shape=10); b: not reached in 100 rounds'
  search.record(4, np.array([0.3, 0.05]), configs, 10)
  assert search.best_round == dict(a=3, b=4)
  assert search.best_config['a'] == dict(lr=0.1, shape=10)
  assert search.horizon() == 3  # a later shape must reach both before round 4
  search.record(2, np.array([0.01, 0.3]), configs, 1)
  assert search.best_round == dict(a=2, b=2)


def test_optimal_loss_is_a_stationary_point_of_the_objective():
  data = feddyn_data.generate_synthetic_logistic(heterogeneity='type1', seed=0)
  x, y = table6_grid.centralised(data)
  opt = table6_grid.optimal_loss(x, y, 1e-5)
  assert opt['grad_max'] < 1e-7
  params = np.zeros(155)
  assert table6_grid._objective(params, x.astype(np.float64), y, 1e-5)[0] > opt['objective']


# ------------------------------------------------- grid == separate runs


def _task():
  # Homogeneous: well conditioned, so lr = 1 does not amplify float rounding (on
  # type 2, lr = 1 is past the stability limit and clipped steps are chaotic:
  # the lanes then agree to ~1e-3 after 120 steps, not 1e-6).
  task = feddyn_data.build_synthetic(TaskOptions(batch_size=10, seed=0,
                                                 synthetic_heterogeneity='homogeneous'))
  return dataclasses.replace(task, test_data=None)


def _zeros():
  return tff.learning.models.ModelWeights(
      trainable=[np.zeros((30, 5), np.float32), np.zeros(5, np.float32)], non_trainable=[])


def _single(method, config, shape, grid):
  """The library's algorithm of one configuration, reporting the device average."""
  reg = dict(client_weight_decay=grid.weight_decay, clip_norm=grid.clip_norm,
             report_device_average=True)
  if method == 'feddyn':
    return lambda fn: feddyn.build_feddyn(fn, feddyn.FedDynConfig(
        alpha=config['alpha'], client_learning_rate=config['lr'],
        client_epochs_per_round=shape, **reg))
  if method == 'scaffold':
    return lambda fn: scaffold.build_scaffold(fn, scaffold.ScaffoldConfig(
        client_learning_rate=config['lr'], local_steps=shape, **reg))
  return lambda fn: fedprox.build_fedprox(fn, fedprox.FedProxConfig(
      mu=config.get('mu', 0.0), client_learning_rate=config['lr'],
      client_epochs_per_round=shape, **reg))


@pytest.mark.parametrize('method,grid', [
    ('feddyn', table6_grid.Grid(learning_rates=(1.0, 0.1), alphas=(0.01,), epochs=(2,))),
    pytest.param('fedprox', table6_grid.Grid(learning_rates=(0.1,), mus=(0.01, 1e-4),
                                             epochs=(2,)), marks=pytest.mark.slow),
    pytest.param('fedavg', table6_grid.Grid(learning_rates=(1.0, 0.1), epochs=(2,)),
                 marks=pytest.mark.slow),
    pytest.param('scaffold', table6_grid.Grid(learning_rates=(1.0, 0.1), scaffold_steps=(30,)),
                 marks=pytest.mark.slow),
])
def test_grid_lanes_equal_separate_trainer_runs(method, grid):
  # Both models: the reported one (the average of all device models) and the
  # server model.
  task = _task()
  configs = grid.lanes(method)
  shape = grid.shapes(method)[0]
  run = training.RunConfig(total_rounds=3, clients_per_round=1, seed=0, rounds_per_eval=0,
                           progress=False, participation_prob=0.3)
  stacked = stacked_logistic.stacked(task, len(configs), 30, 5)
  algorithm = table6_grid.build(method, shape, grid, stacked.model_fn)
  out = training.run_training(algorithm, stacked, run, initial_weights=(
      stacked_logistic.zero_weights(len(configs), 30, 5)))
  lanes = (out.model_weights.trainable, algorithm.process.server_model(out.state).trainable)
  for c, config in enumerate(configs):
    single_algorithm = _single(method, config, shape, grid)(task.model_fn)
    single = training.run_training(single_algorithm, task, run, initial_weights=_zeros())
    for got, want in zip(lanes, (single.model_weights.trainable,
                                 single_algorithm.process.server_model(single.state).trainable)):
      assert np.abs(np.asarray(want[0])).max() > 1e-2  # it trained
      np.testing.assert_allclose(got[0][c], want[0], atol=1e-6, rtol=0)
      np.testing.assert_allclose(got[1][c, 0], want[1], atol=1e-6, rtol=0)


class _Recording(table6_grid.Search):
  """A search that keeps the losses it was given, per round."""

  def record(self, done, losses, configs, shape):
    self.__dict__.setdefault('seen', []).append((done, np.array(losses)))
    super().record(done, losses, configs, shape)


@pytest.mark.parametrize('method', [
    'feddyn', 'fedavg', pytest.param('scaffold', marks=pytest.mark.slow),
    pytest.param('fedprox', marks=pytest.mark.slow)])
def test_grid_scores_the_average_of_all_device_models(method):
  # Paper 003 App. A.2 scores "the average model from all devices". One round
  # from the zero model: a device outside the cohort S still holds zero, so the
  # average of all m = 20 device models is, by the authors' weighting, a known
  # multiple of the server model: FedAvg, FedProx (n_k-weighted, server mean
  # n_k-weighted over S): n_S / n; SCAFFOLD (plain; server: mean over S):
  # |S| / m; FedDyn (plain; server: mean_S theta_k + (1/m) sum_S theta_k):
  # 1 / (m / |S| + 1). Type 3: unequal device sizes.
  grid = table6_grid.Grid(learning_rates=(1.0, 0.1), alphas=(0.01,), mus=(0.01,),
                          epochs=(1,), scaffold_steps=(20,))
  configs, shape = grid.lanes(method), grid.shapes(method)[0]
  task, datas = table6_grid.group_task(('type3',), 0, grid.batch_size)
  stacked = stacked_logistic.stacked(task, len(configs), 30, 5)
  algorithm = table6_grid.build(method, shape, grid, stacked.model_fn)
  assert algorithm.stateful_clients
  run = training.RunConfig(total_rounds=1, clients_per_round=1, seed=0, rounds_per_eval=0,
                           progress=False, participation_prob=0.1)
  out = training.run_training(algorithm, stacked, run, initial_weights=(
      stacked_logistic.zero_weights(len(configs), 30, 5)))
  scored = [np.asarray(v) for v in out.model_weights.trainable]
  server = [np.asarray(v) for v in algorithm.process.server_model(out.state).trainable]

  ids = list(stacked.client_ids)
  sizes = np.asarray(datas[0].sizes, np.float64)
  assert len(ids) == len(sizes) == 20 and len(set(sizes)) > 1
  cohort = [ids.index(c) for c in sampling.draw_cohort(ids, run, 0)]
  m, s = len(ids), len(cohort)
  factor = {'feddyn': 1.0 / (m / s + 1.0), 'scaffold': s / m}.get(
      method, sizes[cohort].sum() / sizes.sum())   # fedavg, fedprox
  assert factor < 0.9 and np.abs(server[0]).max() > 1e-2   # the two models differ
  for got, want in zip(scored, server):
    np.testing.assert_allclose(got, factor * want, rtol=1e-4, atol=1e-7)

  # The grid's search scores that model, its `server` search the server model.
  search = _Recording(targets=dict(never=-1.0), rounds=1,
                      server=_Recording(targets=dict(never=-1.0), rounds=1))
  table6_grid.run_method(method, {shape: algorithm}, task, datas, [search], grid, 0, 0.1)
  x, y = table6_grid.centralised(datas[0])
  for found, (kernel, bias) in ((search, scored), (search.server, server)):
    assert [done for done, _ in found.seen] == [1]
    np.testing.assert_allclose(found.seen[0][1], stacked_logistic.cross_entropy(
        kernel, bias, x, y), rtol=1e-5)
  assert np.all(search.seen[0][1] != search.server.seen[0][1])


@pytest.mark.parametrize('method', [
    'feddyn', pytest.param('scaffold', marks=pytest.mark.slow),
    pytest.param('fedprox', marks=pytest.mark.slow)])
def test_settings_side_by_side_equal_their_own_runs(method):
  # Homogeneous and type 1 as data groups of one run vs each in a run of its
  # own: the same batches and cohorts, so the same models up to float rounding.
  grid = table6_grid.Grid(learning_rates=(1.0, 0.1), alphas=(0.01,), mus=(0.01,),
                          epochs=(2,), scaffold_steps=(30,))
  configs, shape = grid.lanes(method), grid.shapes(method)[0]
  run = training.RunConfig(total_rounds=3, clients_per_round=1, seed=0, rounds_per_eval=0,
                           progress=False, participation_prob=0.3)

  def train(group):
    task, _ = table6_grid.group_task(group, 0, grid.batch_size)
    lanes = len(configs) * len(group)
    stacked = stacked_logistic.stacked(task, lanes, 30, 5, data_groups=len(group))
    algorithm = table6_grid.build(method, shape, grid, stacked.model_fn, len(group))
    return training.run_training(algorithm, stacked, run, initial_weights=(
        stacked_logistic.zero_weights(lanes, 30, 5))).model_weights.trainable

  both = train(('homogeneous', 'type1'))
  for g, setting in enumerate(('homogeneous', 'type1')):
    alone = train((setting,))
    assert np.abs(alone[0]).max() > 1e-1  # it trained
    lanes = slice(g * len(configs), (g + 1) * len(configs))
    np.testing.assert_allclose(both[0][lanes], alone[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(both[1][lanes], alone[1], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_worker_processes_give_the_searches_of_one_process():
  from tff_algos import runtime
  grid = table6_grid.Grid(learning_rates=(0.1,), alphas=(0.01,), epochs=(1,),
                          scaffold_steps=(20,))
  units = [table6_grid.Unit(m, ('homogeneous', 'type1'), 0,
                            ((('paper', 1.4), ('own', 1.2)),) * 2, 6, 0.1)
           for m in ('feddyn', 'scaffold')]
  options = dict(backend='inprocess', workers=None, concurrent_clients=None)
  # This process's default context may be another backend's (the workers get
  # the in-process one): the in-process context on top of it, as test_bit_identical.
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  managed = runtime.ManagedContext(backend='inprocess')
  try:
    with context_stack_impl.context_stack.install(managed.context):
      here = {u.method: found
              for u, (found, _) in table6_grid.run_units(units, grid, 1, options)}
  finally:
    managed.close()
  there = {u.method: found for u, (found, _) in table6_grid.run_units(units, grid, 2, options)}
  assert any(s.best_round for found in here.values() for s in found)  # targets reached
  for method, found in here.items():
    for model in (lambda s: s, lambda s: s.server):   # the device average, the server model
      assert [(model(s).best_round, model(s).best_config) for s in found] == [
          (model(s).best_round, model(s).best_config) for s in there[method]]


# ------------------------------------------------------------ the binary


def test_reproduce_lists_table6_with_the_papers_values():
  exp = {e.name: e for e in paper003.EXPERIMENTS}['feddyn_synthetic_table6']
  values = {p.key: p.value for p in exp.published}
  assert len(values) == 16
  assert values['table.homogeneous.feddyn.mean'] == 32
  assert values['table.type3.scaffold.mean'] == 260
  assert values['table.type2.fedprox.mean'] == 275
  assert exp.runner.module == 'experiments.table6'
  assert exp.runner.smoke_flags == dict(scale='smoke')
  assert all(p.to_target for p in exp.published)  # not reached is a result, not a failure


def _run_binary(tmp_path, *flags, timeout=1200):
  res = subprocess.run([sys.executable, '-m', 'experiments.table6',
                        f'--output_dir={tmp_path}', *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
  assert res.returncode == 0, res.stderr[-3000:]
  return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_table6_smoke_prints_both_tables_and_json(tmp_path):
  out = _run_binary(tmp_path, '--scale=smoke')
  assert set(out['table']) == {'type3'} and set(out['table_own_optimum']) == {'type3'}
  # `table`: the average of all device models (the paper's); also the server model's.
  assert out['scored_model'] == 'device_average'
  assert set(out['table_server_model']) == set(out['table_own_optimum_server_model']) == {'type3'}
  assert set(out['table_server_model']['type3']['fedprox']) >= {'per_seed', 'mean', 'best_config'}
  entry = out['table']['type3']['feddyn']
  assert set(entry) >= {'per_seed', 'mean', 'std', 'ci95', 'reached', 'best_config'}
  assert len(entry['per_seed']) == 1
  assert out['dropped_clients'] == 0
  assert out['timing']['scaffold']['models_per_round'] == 2
  assert out['timing']['fedavg']['models_per_round'] == 1
  goal = out['targets']['type3']
  assert goal['own_optimum']['0'] == pytest.approx(goal['optimum']['0'] + goal['distance'])
  assert os.path.exists(os.path.join(tmp_path, 'smoke_seeds1_rounds2', 'result.json'))
  assert os.path.getsize(os.path.join(tmp_path, 'smoke_seeds1_rounds2', 'table6.png')) > 1000


def test_table6_figure_draws_every_setting_reached_or_not(tmp_path):
  from experiments.lib.table6_grid import figure, summarise
  methods = ['feddyn', 'scaffold', 'fedavg', 'fedprox']
  paper = {setting: dict(zip(methods, values))
           for setting, values in (('homogeneous', (32, 70, 136, 49)), ('type3', (34, 260, 79, 106)))}
  table = {setting: {m: summarise([10.0 * (i + 1), None if i == 3 else 12.0 * (i + 1), 11.0])
                     for i, m in enumerate(methods)} for setting in paper}
  table['type3']['fedprox'] = summarise([None, None, None])  # never reached
  path = figure(table, methods, paper, str(tmp_path / 'table6.png'))
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert os.path.getsize(path) > 10_000


def test_table6_bad_flag_is_one_line_and_status_2(tmp_path):
  res = subprocess.run([sys.executable, '-m', 'experiments.table6', '--settings=type9',
                        f'--output_dir={tmp_path}'], cwd=ROOT, capture_output=True, text=True)
  assert res.returncode == 2
  errors = [l for l in res.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'type9' in errors[0]
  res = subprocess.run([sys.executable, '-m', 'experiments.table6', '--jobs=0',
                        f'--output_dir={tmp_path}'], cwd=ROOT, capture_output=True, text=True)
  assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(
      'error: --jobs must be >= 1')


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_table6_full_scale(tmp_path):
  # 17 min wall on 2 cores (docs/performance.md), more than the default suite can spend on one test.
  out = _run_binary(tmp_path, '--scale=full', timeout=7000)
  assert out['dropped_clients'] == 0
  for setting in ('homogeneous', 'type1', 'type2', 'type3'):
    assert out['table'][setting]['feddyn']['seeds'] == 3
