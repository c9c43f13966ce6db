"""Nastya (paper 001): passes, permutations, the gamma -> 0 limit, FedRR, server steps."""

import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from paths import ROOT
from processes import run_rounds
from tasks import TaskOptions, base, get_task, libsvm, partition
from tff_algos.algorithms.nastya import adaptive_step
from tff_algos.algorithms import fedopt, groups, nastya
from tff_algos.core import composition, optimizers
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams
from tff_algos import training
from tff_algos.training import sampling

SGD = optimizers.OptimizerSpec


# ------------------------------------------- every example once, permutations

SIZES = (7, 8, 9, 10)   # unequal clients; batches of 3 leave ragged last batches
TOTAL = sum(SIZES)
BATCH = 3


class IndexRecorder(base.PlainModel):
  """A scalar model whose metrics record, per example index, how many times it
  was used and its (last) 1-based position in the client's pass."""

  def __init__(self):
    self._w = tf.Variable(0.0)
    self._seen = tf.Variable(tf.zeros([TOTAL]), trainable=False)
    self._position = tf.Variable(tf.zeros([TOTAL]), trainable=False)
    self._counter = tf.Variable(0.0, trainable=False)
    self._weights = [self._w]
    self._metric_variables = [self._seen, self._position, self._counter]
    self._input_spec = collections.OrderedDict(x=tf.TensorSpec([None], tf.float32),
                                               idx=tf.TensorSpec([None], tf.int32))

  @tf.function
  def predict_on_batch(self, x, training=True):
    return x * self._w

  @tf.function
  def forward_pass(self, batch_input, training=True):
    idx = batch_input['idx'][:, None]
    n = tf.shape(idx)[0]
    self._seen.scatter_nd_add(idx, tf.ones([n]))
    self._position.scatter_nd_update(idx, self._counter + 1 + tf.range(n, dtype=tf.float32))
    self._counter.assign_add(tf.cast(n, tf.float32))
    loss = tf.reduce_mean(tf.square(self._w - batch_input['x']))
    return tff.learning.models.BatchOutput(loss=loss, predictions=self._w * batch_input['x'],
                                           num_examples=n)

  @tf.function
  def report_local_unfinalized_metrics(self):
    return collections.OrderedDict(seen=self._seen, position=self._position)

  def metric_finalizers(self):
    return collections.OrderedDict(seen=tf.function(tf.identity),
                                   position=tf.function(tf.identity))

  @tf.function
  def reset_metrics(self):
    for v in self.local_variables:
      v.assign(tf.zeros_like(v))


@pytest.fixture(scope='module')
def indexed():
  parts = np.split(np.arange(TOTAL), np.cumsum(SIZES)[:-1])
  data = collections.OrderedDict(x=np.arange(TOTAL, dtype=np.float32) / TOTAL,
                                 idx=np.arange(TOTAL, dtype=np.int32))
  task = base.Task(name='indexed', train_data=partition.to_client_data(data, parts),
                   preprocess_fn=lambda ds: ds.batch(BATCH), model_fn=IndexRecorder)
  alg = nastya.build_nastya(task.model_fn,
      nastya.NastyaConfig(client_learning_rate=0.1, server_learning_rate=1.0))
  return task, parts, alg


def _record(alg, task, shuffle, rounds, clients=len(SIZES), output_dir=None):
  rows = []
  config = training.RunConfig(total_rounds=rounds, clients_per_round=clients, seed=3,
                              rounds_per_eval=0, rounds_per_checkpoint=1,
                              output_dir=output_dir, progress=False, shuffle=shuffle)
  training.run_training(alg, task, config,
                        round_callback=lambda done, state, row: rows.append(row))
  return rows


def _orders(row, parts):
  """Per client: its example indices in the order the pass used them."""
  position = np.asarray(row['client_work/train/position'])
  return [tuple(part[np.argsort(position[part])]) for part in parts]


def test_each_client_uses_every_example_exactly_once_per_round(indexed):
  task, parts, alg = indexed
  rows = _record(alg, task, 'rr', rounds=3)
  for row in rows:
    np.testing.assert_array_equal(row['client_work/train/seen'], np.ones(TOTAL))
    position = np.asarray(row['client_work/train/position'])
    for part in parts:  # positions 1..n_i: one pass, no repeats, nothing skipped
      assert sorted(position[part]) == list(range(1, len(part) + 1))
    # n_i = local steps = ceil(m_i / B): 3 + 3 + 3 + 4.
    assert row['client_work/client_steps'] == sum(-(-m // BATCH) for m in SIZES)


def test_partial_participation_uses_exactly_the_cohort(indexed):
  task, parts, alg = indexed
  rows = _record(alg, task, 'rr', rounds=3, clients=2)
  for t, row in enumerate(rows):
    cohort = sampling.sample_clients(task.client_ids, 2, seed=3, round_num=t)
    expected = np.zeros(TOTAL)
    for cid in cohort:
      expected[parts[task.client_ids.index(cid)]] = 1
    np.testing.assert_array_equal(row['client_work/train/seen'], expected)
  cohorts = {tuple(sorted(sampling.sample_clients(task.client_ids, 2, 3, t)))
             for t in range(3)}
  assert len(cohorts) > 1  # a fresh cohort is drawn each round


def test_random_reshuffling_draws_a_new_permutation_every_round(indexed):
  task, parts, alg = indexed
  orders = [_orders(row, parts) for row in _record(alg, task, 'rr', rounds=3)]
  for k in range(len(parts)):
    per_round = [orders[t][k] for t in range(3)]
    assert len(set(per_round)) == 3, f'client {k} reused a permutation'
    assert per_round[0] != tuple(parts[k])  # shuffled, not the stored order


def test_shuffle_once_keeps_each_clients_permutation_across_resume(indexed, tmp_path):
  task, parts, alg = indexed
  first = _record(alg, task, 'so', rounds=2, output_dir=str(tmp_path))
  resumed = _record(alg, task, 'so', rounds=4, output_dir=str(tmp_path))
  assert [r['round'] for r in resumed] == [3, 4]  # continued from the checkpoint
  orders = [_orders(row, parts) for row in first + resumed]
  assert all(o == orders[0] for o in orders)
  assert any(o != tuple(p) for o, p in zip(orders[0], parts))  # shuffled once
  # Each client's order is a permutation of its own examples.
  assert all(sorted(o) == sorted(p) for o, p in zip(orders[0], parts))


def test_shuffle_seeds_give_so_fixed_and_rr_fresh_orders(indexed):
  """The same property on the datasets the loop builds (no TFF)."""
  task, parts, _ = indexed
  def order(mode, t, cid):
    ds = task.client_dataset(cid, sampling.shuffle_seed(mode, 0, t, cid),
                             reshuffle_each_epoch=mode == 'rr')
    return tuple(np.concatenate([b['idx'].numpy() for b in ds]))
  for cid, part in zip(task.client_ids, parts):
    so = {order('so', t, cid) for t in range(5)}
    rr = {order('rr', t, cid) for t in range(5)}
    assert len(so) == 1 and len(rr) == 5
    assert sorted(next(iter(so))) == part.tolist()
    assert order('none', 0, cid) == tuple(part)


# ---------------------------------------------------- logistic: gamma -> 0, GD

N_SMALL = 4


@pytest.fixture(scope='module')
def logistic():
  """480 breast-cancer examples over 4 IID clients of 120, batches of 10."""
  x, y = libsvm.breast_cancer_arrays()
  task = libsvm.build_logistic(x[:480], y[:480], num_clients=N_SMALL, batch_size=10)
  return task, libsvm.problem_of(task)


def _weights(x):
  return tff.learning.models.ModelWeights(trainable=[np.asarray(x, np.float64)],
                                          non_trainable=[])


def _fixed_data(task, cids=None):
  return [task.client_dataset(cid) for cid in (cids or task.client_ids)]


def _run(alg, x0, data, rounds):
  return run_rounds(alg.process, _weights(x0), data, rounds)


def _x(state):
  return np.asarray(state.global_model_weights.trainable[0])


def _x0(seed=0):
  return np.random.default_rng(seed).normal(size=31) * 0.5


def _client_gradient_error(task, gamma, x0):
  """max over clients of ||g_i - grad f_i(x0)|| / ||grad f_i(x0)||."""
  alg = nastya.build_nastya(task.model_fn,
      nastya.NastyaConfig(client_learning_rate=gamma, server_learning_rate=1.0))
  errors = []
  for cid in task.client_ids:
    state, _ = _run(alg, x0, _fixed_data(task, [cid]), 1)
    g = x0 - _x(state)   # eta = 1 and a cohort of one: x1 = x0 - g_i
    f_i = libsvm.LogisticProblem.from_client_arrays(
        [task.train_data.client_arrays(cid)], task.info['l2_reg'])
    errors.append(np.linalg.norm(g - f_i.grad(x0)) / np.linalg.norm(f_i.grad(x0)))
  return max(errors)


def test_small_gamma_sends_the_full_local_gradient(logistic):
  task, _ = logistic
  x0 = _x0()
  tiny = _client_gradient_error(task, 1e-6, x0)
  assert tiny < 1e-4
  # The error is the O(gamma) drift of the pass (not a tolerance artefact).
  assert _client_gradient_error(task, 1e-4, x0) > 30 * tiny


def test_full_participation_with_small_gamma_is_gradient_descent(logistic):
  task, prob = logistic
  eta, rounds = 1.0 / prob.smoothness(), 5
  alg = nastya.build_nastya(task.model_fn,
      nastya.NastyaConfig(client_learning_rate=1e-6, server_learning_rate=eta))
  x0 = _x0(1)
  config = training.RunConfig(total_rounds=rounds, clients_per_round=N_SMALL, seed=0,
                              rounds_per_eval=0, progress=False, shuffle='rr')
  got = np.asarray(training.run_training(alg, task, config, initial_weights=_weights(x0)
                                         ).model_weights.trainable[0])
  x = x0.copy()
  for _ in range(rounds):
    x = x - eta * prob.grad(x)
  assert np.linalg.norm(x - x0) > 0.1
  assert np.linalg.norm(got - x) < 1e-4 * np.linalg.norm(x - x0)


# ------------------------------------------------------------------- FedRR

GAMMA = 2.0 ** -4   # gamma and eta = gamma * n are exact in binary


def test_eta_gamma_n_reproduces_one_epoch_fedavg(logistic):
  task, _ = logistic
  steps = 120 // 10
  data, x0 = _fixed_data(task), _x0(2)
  ours = nastya.build_nastya(task.model_fn,
      nastya.NastyaConfig(client_learning_rate=GAMMA, server_learning_rate=GAMMA * steps))
  fedavg = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(client_learning_rate=GAMMA,
      server_learning_rate=1.0, client_epochs_per_round=1, uniform_weighting=True))
  fedrr = nastya.build_fedrr(task.model_fn, nastya.FedRRConfig(client_learning_rate=GAMMA))
  s1, out = _run(ours, x0, data, 3)
  s2, _ = _run(fedavg, x0, data, 3)
  s3, _ = _run(fedrr, x0, data, 3)
  assert np.linalg.norm(_x(s2) - x0) > 0.1
  np.testing.assert_allclose(_x(s1), _x(s2), rtol=0, atol=1e-13)
  np.testing.assert_array_equal(_x(s3), _x(s2))
  assert out[-1].metrics['client_work']['client_steps'] == N_SMALL * steps


def test_fedrr_averages_local_models_for_unequal_clients():
  """FedRR with clients of 34, 33, 33 points (batch 1) against a numpy replay."""
  x, y = libsvm.breast_cancer_arrays()
  task = libsvm.build_logistic(x[:100], y[:100], num_clients=3, batch_size=1)
  lam, gamma, x0 = task.info['l2_reg'], 2.0 ** -5, _x0(3)  # gamma exact in float32
  fedrr = nastya.build_fedrr(task.model_fn, nastya.FedRRConfig(client_learning_rate=gamma))
  state, _ = _run(fedrr, x0, _fixed_data(task), 1)
  models = []
  for cid in task.client_ids:
    arrays = task.train_data.client_arrays(cid)
    w = x0.copy()
    for a, b in zip(arrays['x'].astype(np.float64), arrays['y']):
      w = w - gamma * (a * (1 / (1 + np.exp(-a @ w)) - b) + lam * w)
    models.append(w)
  assert sorted(len(task.train_data.client_arrays(c)['y']) for c in task.client_ids) == [33, 33, 34]
  np.testing.assert_allclose(_x(state), np.mean(models, axis=0), rtol=0, atol=1e-12)


def test_step_schedule_divides_gamma_by_10_at_the_milestones():
  """Paper 001 section 8: 0.2, divided by 10 at epochs 150 and 200 (host and graph)."""
  from tff_algos.core import schedules
  sched = nastya.NastyaConfig(client_learning_rate=0.2, client_lr_milestones=(150, 200)).client_lr()
  for t, want in ((0, 0.2), (149, 0.2), (150, 0.02), (199, 0.02), (200, 0.002), (400, 0.002)):
    assert sched(t) == pytest.approx(want)
    assert float(sched(tf.constant(t))) == pytest.approx(want, rel=1e-6)
  with pytest.raises(ValueError, match='increasing'):
    schedules.StepDecay(0.2, (200, 150))
  with pytest.raises(ValueError, match='not both'):
    nastya.NastyaConfig(client_learning_rate=0.2, client_lr_decay=0.9, client_lr_milestones=(5,))


def test_fedrr_with_a_milestone_steps_at_gamma_over_10_after_it():
  """Two FedRR rounds with gamma / 10 from round 1 = one round at gamma, then one at
  gamma / 10 from there."""
  x, y = libsvm.breast_cancer_arrays()
  task = libsvm.build_logistic(x[:60], y[:60], num_clients=2, batch_size=4)
  data, x0, gamma = _fixed_data(task), _x0(5), 2.0 ** -3
  stepped, _ = _run(algorithm_flags.build('fedrr', task.model_fn, HParams(
      client_learning_rate=gamma, client_lr_milestones=['1'])), x0, data, 2)
  first, _ = _run(nastya.build_fedrr(task.model_fn, nastya.FedRRConfig(client_learning_rate=gamma)),
      x0, data, 1)
  second, _ = _run(nastya.build_fedrr(task.model_fn,
      nastya.FedRRConfig(client_learning_rate=gamma / 10)),
                   _x(first), data, 1)
  assert np.linalg.norm(_x(second) - _x(first)) > 1e-4
  np.testing.assert_allclose(_x(stepped), _x(second), rtol=0, atol=1e-6)


# ------------------------------------------------------------- server steps


def _g_at(task, x, data):
  """g_t at x: one Nastya round with server SGD at eta = 1 gives x - g_t."""
  alg = _g_at.cache.setdefault(id(task), nastya.build_nastya(
      task.model_fn, nastya.NastyaConfig(client_learning_rate=0.01, server_learning_rate=1.0)))
  state, _ = _run(alg, x, data, 1)
  return x - _x(state)


_g_at.cache = {}


def _mm_steps(task, data, x0, eta0, rounds):
  """Malitsky-Mishchenko on the g_t of `data`, in numpy (theta_0 = inf)."""
  x, eta, theta = x0.copy(), eta0, np.inf
  x_prev = g_prev = None
  etas = []
  for t in range(rounds):
    g = _g_at(task, x, data)
    if t > 0:
      lipschitz = np.linalg.norm(g - g_prev) / np.linalg.norm(x - x_prev)
      eta_new = min(np.sqrt(1 + theta) * eta, 1 / (2 * lipschitz))
      theta, eta = eta_new / eta, eta_new
    etas.append(eta)
    x_prev, g_prev, x = x, g, x - eta * g
  return x, etas, theta


def test_adaptive_server_step_matches_the_formula(logistic):
  task, prob = logistic
  data, x0, eta0 = _fixed_data(task), _x0(4), 0.5 / prob.smoothness()
  expected, etas, theta = _mm_steps(task, data, x0, eta0, 3)
  alg = nastya.build_nastya(task.model_fn, nastya.NastyaConfig(client_learning_rate=0.01,
      server_learning_rate=eta0, server_adaptive_lr=True))
  state, outs = _run(alg, x0, data, 3)
  np.testing.assert_allclose(_x(state), expected, rtol=0, atol=1e-12)
  finalizer = state.finalizer
  assert finalizer['learning_rate'] == pytest.approx(etas[-1], rel=1e-12)
  assert finalizer['theta'] == pytest.approx(theta, rel=1e-12)
  assert finalizer['step'] == 3
  assert etas[1] != pytest.approx(eta0) and etas[2] != pytest.approx(etas[1])  # it adapts
  assert all(o.metrics['finalizer']['update_non_finite'] == 0 for o in outs)


def _optimizer_steps(opt, points):
  """Runs AdaptiveGD eagerly from x = points[0][0] with the given gradients."""
  state = opt.initialize([tf.TensorSpec([2], tf.float64)])
  x = [tf.constant(points[0], tf.float64)]
  log = []
  for g in points[1:]:
    state, x = opt.next(state, x, [tf.constant(g, tf.float64)])
    log.append((float(state['learning_rate']), float(state['theta']), x[0].numpy()))
  return log


def test_adaptive_step_first_round_and_zero_curvature():
  # Step 0 uses eta_0; step 1 has theta_0 = inf, so eta_1 = 1/(2 L_1).
  log = _optimizer_steps(adaptive_step.AdaptiveGD(0.5),
                         [[1.0, 1.0], [1.0, 0.0], [0.8, 0.0], [0.8, 0.0]])
  (e0, t0, x1), (e1, t1, x2), (e2, t2, x3) = log
  assert e0 == 0.5 and np.isinf(t0) and np.allclose(x1, [0.5, 1.0])
  # L_1 = ||g1 - g0|| / ||x1 - x0|| = 0.2 / 0.5.
  assert e1 == pytest.approx(1 / (2 * 0.4)) and t1 == pytest.approx(1.25 / 0.5)
  np.testing.assert_allclose(x2, [0.5 - 1.25 * 0.8, 1.0])
  # L_2 = 0 (same gradient): only the growth term sqrt(1 + theta_1) eta_1.
  assert e2 == pytest.approx(np.sqrt(1 + 2.5) * 1.25) and t2 == pytest.approx(np.sqrt(3.5))
  # L_1 = 0 right after the first step: both terms infinite, keep eta_0.
  (_, _, _), (e1, t1, _) = _optimizer_steps(adaptive_step.AdaptiveGD(0.5),
                                            [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
  assert e1 == 0.5 and t1 == 1.0


def test_adaptive_finalizer_rejects_non_finite_updates(logistic):
  task, _ = logistic
  weights_type = composition.initial_weights_computation(task.model_fn).type_signature.result
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      adaptive_step.AdaptiveGD(0.3), weights_type)
  state = finalizer.initialize()
  x0 = _x0(5)
  good = finalizer.next(state, _weights(x0), [np.full(31, 0.1)])
  bad_update = np.full(31, 0.2)
  bad_update[3] = np.nan
  bad = finalizer.next(good.state, good.result, [bad_update])
  assert bad.measurements['update_non_finite'] == 1
  np.testing.assert_array_equal(bad.result.trainable[0], good.result.trainable[0])
  for a, b in zip(tf.nest.flatten(bad.state), tf.nest.flatten(good.state)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(good.result.trainable[0], x0 - 0.03)


def test_adam_server_step_is_adam_on_g_t(logistic):
  task, _ = logistic
  data, x0 = _fixed_data(task), _x0(6)
  spec = SGD('adam', 0.05)
  b1, b2, eps = spec.get('beta_1'), spec.get('beta_2'), spec.get('epsilon')
  x, m, v = x0.copy(), np.zeros(31), np.zeros(31)
  for t in (1, 2):
    g = _g_at(task, x, data)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g ** 2
    x = x - spec.learning_rate * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
  alg = nastya.build_nastya(task.model_fn, nastya.NastyaConfig(
      client_learning_rate=0.01, **groups.optimizer_fields('server', spec)))
  state, _ = _run(alg, x0, data, 2)
  np.testing.assert_allclose(_x(state), x, rtol=0, atol=1e-6)
  assert np.linalg.norm(x - x0) > 0.05


# ------------------------------------------- the paper's claim, on the embedded task


def test_large_server_step_beats_fedrr_at_small_gamma():
  """Full participation, gamma = 1e-3, B = 1, N = 10: eta = 1/L vs FedRR (eta = gamma n)."""
  task = get_task('logistic', TaskOptions(batch_size=1, num_clients=10))
  prob = libsvm.problem_of(task)
  _, f_star = prob.solve()
  gamma, rounds = 1e-3, 10
  config = training.RunConfig(total_rounds=rounds, clients_per_round=10, seed=0,
                              rounds_per_eval=0, progress=False, shuffle='rr')

  def gap(alg):
    w = training.run_training(alg, task, config).model_weights.trainable[0]
    return prob.loss(np.asarray(w)) - f_star

  big = gap(nastya.build_nastya(task.model_fn, nastya.NastyaConfig(client_learning_rate=gamma,
      server_learning_rate=1.0 / prob.smoothness())))
  fedrr = gap(nastya.build_fedrr(task.model_fn, nastya.FedRRConfig(client_learning_rate=gamma)))
  assert 0 < big < 0.5 * fedrr


# ------------------------------------------------------------------ trainer


@pytest.mark.parametrize('name,hp,message', [
    ('nastya', HParams(client_optimizer='adam'), 'plain SGD'),
    ('nastya', HParams(local_steps=5), 'exactly one pass'),
    ('nastya', HParams(server_optimizer='adam', server_adaptive_lr=True),
     'adaptive server step is plain SGD'),
    ('nastya', HParams(client_learning_rate=0.0), 'gamma must be > 0'),
    ('fedrr', HParams(server_learning_rate=0.5), 'fedrr has no server step'),
    ('fedrr', HParams(server_adaptive_lr=True), '--server_adaptive_lr is not used by fedrr'),
])
def test_trainer_rejects_bad_hparams(name, hp, message):
  with pytest.raises(ValueError, match=message):
    algorithm_flags.check(name, hp)


def test_trainer_runs_nastya_with_shuffle_once(tmp_path):
  cmd = [sys.executable, '-m', 'experiments.train', '--task=logistic', '--algorithm=nastya',
         '--shuffle=so', '--num_clients=4', '--clients_per_round=2',
         '--client_batch_size=8', '--client_learning_rate=0.01',
         '--server_learning_rate=0.3', '--server_adaptive_lr', '--partition=sorted',
         '--total_rounds=2', '--rounds_per_eval=1', '--noprogress',
         f'--root_output_dir={tmp_path}', '--experiment_name=n']
  res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'nastya on logistic' in res.stdout and 'binary_accuracy' in res.stdout
  with open(tmp_path / 'n' / 'metrics.csv') as f:
    assert len(f.read().strip().splitlines()) == 3


def test_experiment_binary_prints_gaps_as_json(tmp_path):
  cmd = [sys.executable, '-m', 'experiments.nastya', '--rounds=3', '--settings=full,partial',
         '--num_clients=4', '--clients_per_round=2', '--batch_size=20', '--gamma=1e-3',
         '--runs=nastya_eta1/L,fedrr,local_sgd_wr,nastya_adaptive',
         f'--output_dir={tmp_path}']
  res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  result = json.loads(res.stdout.strip().splitlines()[-1])
  gaps = result['final_gap']
  assert set(gaps) == {'full', 'partial'}
  assert set(gaps['full']) == {'nastya_eta1/L', 'fedrr', 'local_sgd_wr', 'nastya_adaptive'}
  assert all(0 < g < 1 for runs in gaps.values() for g in runs.values())
  assert gaps['full']['nastya_eta1/L'] < gaps['full']['fedrr']
  assert (tmp_path / 'nastya.png').exists() and (tmp_path / 'gaps.csv').exists()
