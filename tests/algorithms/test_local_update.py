"""LocalUpdate / LocalUpdateDecay against paper 002's exact quadratic theory,
against our FedAvg, and the plateau rule against the reference sequences."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import TaskOptions, get_task, quadratic
from tff_algos.algorithms import fedopt, local_update
from tff_algos.algorithms.local_update import plateau
from tff_algos.core import optimizers
from tff_algos import training

DIM = 3


def _spd(rng, dim):
  m = rng.normal(size=(dim, dim))
  return m @ m.T / dim + 0.3 * np.eye(dim)


@pytest.fixture(scope='module')
def quad():
  rng = np.random.default_rng(0)
  a = np.stack([_spd(rng, DIM) for _ in range(3)])
  c = rng.normal(size=(3, DIM))
  x0 = rng.normal(size=DIM)
  return a, c, x0, quadratic.build_quadratic_form(a, c, x_init=x0)


def _one_round_q(task, theta, gamma):
  """Mean client output q = x_0 - x_1 for server SGD with eta = 1, all clients."""
  alg = local_update.build_local_update(task.model_fn, local_update.LocalUpdateConfig(
      theta=tuple(theta), client_learning_rate=gamma, server_learning_rate=1.0))
  state = alg.process.initialize()
  x0 = np.asarray(state.global_model_weights.trainable[0], np.float64)
  data = [task.client_dataset(cid) for cid in task.client_ids]
  out = alg.process.next(state, data)
  return x0 - np.asarray(out.state.global_model_weights.trainable[0], np.float64), out


def _q_theory(a, c, x, theta, gamma):
  qs = []
  for ai, ci in zip(a, c):
    step = np.eye(len(x)) - gamma * ai
    qmat = sum(t * np.linalg.matrix_power(step, k) for k, t in enumerate(theta))
    qs.append(qmat @ ai @ (x - ci))
  return np.mean(qs, axis=0)


@pytest.mark.parametrize('theta,gamma', [
    ((1, 1, 1, 1, 1), 0.1),          # Theta_{1:5}: FedAvg/Reptile
    ((0, 0, 0, 1), 0.2),             # Theta_4: FOMAML
    ((0,) * 6 + (1,), 0.05),         # Theta_{2*3+1}: K-MAML, K = 3
    ((1,), 0.3),                     # Theta_1: minibatch SGD
    ((0.5, 0, 2, 1), 0.15),          # arbitrary weights
])
def test_client_output_is_Q_A_x_minus_c(quad, theta, gamma):
  a, c, x0, task = quad
  q, out = _one_round_q(task, theta, gamma)
  np.testing.assert_allclose(q, _q_theory(a, c, x0, theta, gamma), rtol=1e-4, atol=1e-5)
  assert out.metrics['client_work']['client_steps'] == 3 * len(theta)


@pytest.mark.parametrize('theta', [(1, 1, 1, 1), (0, 0, 0, 1), (0, 1, 0, 1, 1), (0.5, 0, 2, 1)])
def test_theta_sum_equals_the_weighted_sum_bit_for_bit(theta):
  """0/1 weights add g_k or nothing (no product); the sums equal
  s + theta_k g_k bitwise, steps past Theta adding 0."""
  transform = local_update.theta_weighted_sum(np.asarray(theta, np.float32))
  rng = np.random.default_rng(3)
  weights = (tf.zeros([5, 3]), tf.zeros([3]))
  state = transform.init(weights)
  expected = [np.zeros([5, 3], np.float32), np.zeros([3], np.float32)]
  update = tf.function(transform.update)
  for step in range(len(theta) + 2):
    grads = tuple(tf.constant(rng.normal(size=w.shape).astype(np.float32)) for w in weights)
    out, state = update(grads, weights, state, tf.constant(step))
    theta_k = np.float32(theta[step] if step < len(theta) else 0.0)
    expected = [s + theta_k * g.numpy() for s, g in zip(expected, grads)]
    for o, g in zip(out, grads):  # the step's gradient itself is unchanged
      np.testing.assert_array_equal(o.numpy(), g.numpy())
    for got, want in zip(state, expected):
      np.testing.assert_array_equal(got.numpy().view(np.int32), want.view(np.int32))


def test_update_norm_is_the_norm_of_q_before_eta(quad):
  # Paper 002, Fig. 3: ||q_t||, the averaged client output (x_{t+1} = x_t - eta q_t).
  a, c, x0, task = quad
  alg = local_update.build_local_update(task.model_fn, local_update.LocalUpdateConfig(
      theta=(1.0, 1.0, 1.0), client_learning_rate=0.1, server_learning_rate=0.25))
  state = alg.process.initialize()
  out = alg.process.next(state, [task.client_dataset(cid) for cid in task.client_ids])
  q = _q_theory(a, c, x0, (1, 1, 1), 0.1)
  assert out.metrics['aggregator']['update_norm'] == pytest.approx(np.linalg.norm(q), rel=1e-4)
  step = x0 - np.asarray(out.state.global_model_weights.trainable[0], np.float64)
  np.testing.assert_allclose(step, 0.25 * q, rtol=1e-4, atol=1e-6)


def test_reference_semantics_flag_weights_by_examples_unless_uniform():
  from tff_algos.flags.algorithm_flags import HParams
  from tff_algos.flags import algorithm_flags
  ref = HParams(decay_reference_semantics=True)
  assert algorithm_flags.config('local_update', ref).example_weighted
  assert algorithm_flags.config('local_update_decay', ref).semantics == 'reference'
  assert not algorithm_flags.config('local_update', HParams(
      decay_reference_semantics=True, uniform_weighting=True)).example_weighted
  paper = HParams()
  assert not algorithm_flags.config('local_update', paper).example_weighted
  assert algorithm_flags.config('local_update_decay', paper).semantics == 'paper'


def test_gamma_zero_gives_the_true_gradient(quad):
  a, c, x0, task = quad
  grad = np.mean([ai @ (x0 - ci) for ai, ci in zip(a, c)], axis=0)
  q, _ = _one_round_q(task, (0, 0, 1), 0.0)            # Theta_K at gamma = 0
  np.testing.assert_allclose(q, grad, rtol=1e-5, atol=1e-6)
  q, _ = _one_round_q(task, (1, 1, 1, 1), 0.0)         # sum theta = 4
  np.testing.assert_allclose(q, 4 * grad, rtol=1e-5, atol=1e-6)


def test_reptile_eigenvalues_are_phi(quad):
  """Diagonal A: along eigenvector j, q_j = (1 - (1 - gamma lam_j)^K)/gamma * (x - c)_j."""
  lam = np.array([0.5, 2.0, 4.0])
  c = np.array([[1.0, -1.0, 0.5]])
  x0 = np.array([0.2, 0.3, -0.4])
  task = quadratic.build_quadratic_form(np.diag(lam)[None], c, x_init=x0)
  k, gamma = 6, 0.2
  q, _ = _one_round_q(task, np.ones(k), gamma)
  phi = (1 - (1 - gamma * lam) ** k) / gamma
  np.testing.assert_allclose(q, phi * (x0 - c[0]), rtol=1e-5)


def test_presets():
  assert local_update.theta_preset('reptile', 3).tolist() == [1, 1, 1]
  assert local_update.theta_preset('fomaml', 3).tolist() == [0, 0, 1]
  assert local_update.theta_preset('kmaml', 2).tolist() == [0, 0, 0, 0, 1]
  assert local_update.theta_preset('minibatch_sgd', 9).tolist() == [1]
  assert local_update.parse_theta('1,0,2,0,0', 5).tolist() == [1, 0, 2]
  for bad in ('-1,2', '0,0', 'maml', ''):
    with pytest.raises(ValueError):
      local_update.parse_theta(bad, 3)


def test_reptile_with_eta_gamma_is_fedavg_with_server_lr_1():
  task = get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='logistic'))
  data = [task.client_dataset(cid) for cid in task.client_ids[:4]]
  init = training.initial_model_weights(task, 0)
  gamma, k = 0.1, 4
  lu = local_update.build_local_update(task.model_fn, local_update.LocalUpdateConfig(
      theta=(1.0,) * k, client_learning_rate=gamma, server_learning_rate=gamma))
  fa = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(client_learning_rate=gamma,
      local_steps=k, server_learning_rate=1.0, uniform_weighting=True))
  results = []
  for alg in (lu, fa):
    state = alg.process.set_model_weights(alg.process.initialize(), init)
    for _ in range(3):
      state = alg.process.next(state, data).state
    results.append(alg.process.get_model_weights(state).trainable)
  for x, y in zip(*results):
    np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)
  assert max(np.abs(np.asarray(x) - y).max() for x, y in zip(results[0], init.trainable)) > 1e-2


# --- plateau rule (`semantics='reference'`: the authors' code): reference sequences ---

def _run_plateau(cfg, values):
  state = plateau.initial_state(cfg)
  trace = []
  for v in values:
    state = plateau.update(state, tf.constant(v, tf.float32), cfg)
    trace.append({k: np.asarray(v) for k, v in state.items()})
  return trace


def test_plateau_window_3_patience_1_cooldown_0():
  cfg = plateau.PlateauConfig(initial_lr=1.0, decay_factor=0.5, window_size=3,
                              patience=1, cooldown=0, semantics='reference')
  t = _run_plateau(cfg, [3.0, 3.0, 6.0])
  assert [float(s['lr']) for s in t] == [0.5, 0.25, 0.25]
  assert np.isinf(t[0]['best']) and np.isinf(t[1]['best'])
  assert float(t[2]['best']) == 4.0


def test_plateau_maximise_mode_waits_then_decays():
  cfg = plateau.PlateauConfig(initial_lr=1.0, decay_factor=0.5, window_size=3,
                              patience=5, cooldown=0, mode='max', semantics='reference')
  t = _run_plateau(cfg, [-1.0] * 5)
  assert [int(s['wait']) for s in t[:4]] == [1, 2, 3, 4]
  assert [float(s['lr']) for s in t] == [1.0, 1.0, 1.0, 1.0, 0.5]
  assert int(t[4]['wait']) == 0


def test_plateau_cooldown_counts_down_then_decays_and_resets():
  # Window 5: the average stays +inf over these inputs, so nothing "improves".
  cfg = plateau.PlateauConfig(initial_lr=1.0, decay_factor=0.5, window_size=5,
                              patience=0, cooldown=3, semantics='reference')
  t = _run_plateau(cfg, [1.0, 1.0, 1.0])
  assert [int(s['cooldown_counter']) for s in t] == [2, 1, 3]
  assert [float(s['lr']) for s in t] == [1.0, 1.0, 0.5]


def test_partial_window_averages_what_it_has():
  cfg = plateau.PlateauConfig(initial_lr=1.0, window_size=3, patience=10, cooldown=0,
                              semantics='paper')
  t = _run_plateau(cfg, [4.0, 2.0, 6.0, 10.0])
  assert [float(s['best']) for s in t] == [4.0, 3.0, 3.0, 3.0]  # 4, 3, 4, 6


def _decay_rounds(cfg, values):
  lrs = [float(s['lr']) for s in _run_plateau(cfg, values)]
  return [t for t in range(len(lrs)) if lrs[t] < (lrs[t - 1] if t else cfg.initial_lr)]


PAPER_002 = dict(initial_lr=1.0, decay_factor=0.1, min_delta=1e-4, window_size=100,
                 patience=100, cooldown=100)
SLOW_FALL = [2.0 - 5e-5 * t for t in range(1000)]  # between Delta/P and Delta per round


def test_paper_rule_decays_on_a_slow_steady_fall():
  # Eq. 25: every round is within Delta of the running minimum, so the counter
  # only grows; 99 rounds of cooldown, then P = 100 rounds, then 199 per decay.
  cfg = plateau.PlateauConfig(**PAPER_002)
  assert cfg.semantics == 'paper'
  assert _decay_rounds(cfg, SLOW_FALL) == [198, 397, 596, 795, 994]


def test_reference_rule_never_decays_on_the_same_fall():
  # Keras's best moves every 2-4 rounds (a window fall of > Delta), resetting the counter.
  cfg = plateau.PlateauConfig(**PAPER_002, semantics='reference')
  assert _decay_rounds(cfg, SLOW_FALL) == []


def test_both_rules_decay_on_a_flat_loss_and_neither_on_a_fast_fall():
  flat = [1.0] * 500
  fast = [2.0 - 4e-4 * t for t in range(500)]  # the window falls by >= 2 Delta
  for semantics in plateau.SEMANTICS:
    cfg = plateau.PlateauConfig(**PAPER_002, semantics=semantics)
    assert _decay_rounds(cfg, fast) == []
    # Paper: the partial window is full of 1.0 at once; reference: finite from round 99.
    assert _decay_rounds(cfg, flat) == ([198, 397] if semantics == 'paper' else [199, 398])


def test_paper_running_minimum_counts_from_the_lowest_value_not_the_last_improvement():
  # W = 1, P = 2, Delta = 1, every step falls by < Delta. Paper: the minimum follows
  # the loss, so no round is Delta below it and a decay comes every P rounds.
  # Reference: best stays 10 until 8.6 <= 10 - 1 resets the counter.
  values = [10.0, 9.5, 9.0, 8.6, 8.3, 8.0]
  common = dict(initial_lr=1.0, decay_factor=0.5, min_delta=1.0, window_size=1,
                patience=2, cooldown=0)
  paper = _run_plateau(plateau.PlateauConfig(**common), values)
  ref = _run_plateau(plateau.PlateauConfig(**common, semantics='reference'), values)
  assert [float(s['best']) for s in paper] == pytest.approx([10, 9.5, 9.0, 8.6, 8.3, 8.0])
  assert [int(s['wait']) for s in paper] == [0, 1, 0, 1, 0, 1]
  assert [float(s['best']) for s in ref] == pytest.approx([10, 10, 10, 8.6, 8.6, 8.6])
  assert [int(s['wait']) for s in ref] == [0, 1, 0, 0, 1, 0]
  assert [float(s['lr']) for s in paper] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
  assert [float(s['lr']) for s in ref] == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25]


def test_unknown_semantics_rejected():
  with pytest.raises(ValueError, match='semantics'):
    plateau.PlateauConfig(initial_lr=1.0, semantics='keras')


# --- LocalUpdateDecay in TFF ---------------------------------------------------

def test_pre_training_loss_is_measured_before_any_local_step(quad):
  a, c, x0, task = quad
  alg = local_update.build_local_update_decay(task.model_fn, local_update.LocalUpdateDecayConfig(theta=(1.0,) * 5, client_learning_rate=0.2, decay_window=2, decay_patience=1, decay_cooldown=0))
  state = alg.process.initialize()
  out = alg.process.next(state, [task.client_dataset(cid) for cid in task.client_ids])
  expected = np.mean([0.5 * (x0 - ci) @ ai @ (x0 - ci) for ai, ci in zip(a, c)])
  cw = out.metrics['client_work']
  assert cw['pre_training_loss'] == pytest.approx(expected, rel=1e-5)
  # Training changes the loss, so a post-training measurement would differ.
  assert abs(cw['train']['loss'] - expected) > 1e-2


def _decay_run(task, out_dir, crash_at=None):
  alg = local_update.build_local_update_decay(task.model_fn, local_update.LocalUpdateDecayConfig(theta=(1.0,) * 2, client_learning_rate=0.1, server_learning_rate=0.1, decay_min_delta=100.0, decay_window=2, decay_patience=2, decay_cooldown=1, client_lr_decay_factor=0.5, server_lr_decay_factor=0.8))

  def crash(done, state, row):
    if done == crash_at:
      raise KeyboardInterrupt()

  cfg = training.RunConfig(total_rounds=9, clients_per_round=3, rounds_per_eval=0,
                           rounds_per_checkpoint=2, output_dir=out_dir, progress=False)
  return training.run_training(alg, task, cfg, round_callback=crash if crash_at else None)


def test_resumed_decay_run_decays_at_the_same_rounds(tmp_path):
  task = get_task('digits', TaskOptions(batch_size=16, num_clients=10, model='logistic'))
  _decay_run(task, str(tmp_path / 'full'))
  with pytest.raises(KeyboardInterrupt):
    _decay_run(task, str(tmp_path / 'cut'), crash_at=6)
  resumed = _decay_run(task, str(tmp_path / 'cut'))
  assert resumed.resumed_from == 4

  def lrs(d):
    with open(os.path.join(d, 'metrics.csv')) as f:
      rows = list(csv.DictReader(f))
    return ([float(r['client_work/client_learning_rate']) for r in rows],
            [float(r['client_work/server_learning_rate']) for r in rows])

  full, cut = lrs(tmp_path / 'full'), lrs(tmp_path / 'cut')
  assert full == cut
  gammas = full[0]
  assert gammas[0] == pytest.approx(0.1) and gammas[-1] < 0.1 / 3  # it did decay
  assert all(a >= b for a, b in zip(gammas, gammas[1:]))  # never increases
