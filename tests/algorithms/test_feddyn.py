"""FedDyn (paper 003): convergence, exact update equations, exact resume."""

import numpy as np
import pytest

from least_squares import Problem, model, run_stateful
from tasks import TaskOptions, get_task
from tff_algos.algorithms import feddyn
from tff_algos.algorithms import fedopt
from tff_algos.core import optimizers
from tff_algos.core.stateful_process import Population
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams
from tff_algos.training import client_state
from tff_algos import training
from tff_algos.training import sampling


def test_feddyn_reaches_the_optimum_where_fedavg_stalls():
  # Full participation, 30 full-batch local GD steps (near-exact local solves).
  p = Problem()
  rounds, gamma, k = 30, 0.05, 30
  dyn = feddyn.build_feddyn(p.model_fn, feddyn.FedDynConfig(
      alpha=3.0, client_learning_rate=gamma, local_steps=k))
  state, _ = run_stateful(dyn.process, p, [list(range(4))] * rounds, np.zeros(3))
  dyn_error = np.abs(model(dyn.process, state) - p.optimum).max()

  avg = fedopt.build_fedopt(p.model_fn, fedopt.FedOptConfig(client_learning_rate=gamma,
      local_steps=k, uniform_weighting=True)).process
  s = avg.set_model_weights(avg.initialize(), p.weights(np.zeros(3)))
  trajectory = []
  for _ in range(rounds):
    s = avg.next(s, p.datasets()).state
    trajectory.append(np.asarray(avg.get_model_weights(s).trainable[0], np.float64))
  avg_error = np.abs(trajectory[-1] - p.optimum).max()
  print(f'FedDyn error {dyn_error:.2e}, FedAvg error {avg_error:.3f}')
  assert dyn_error < 1e-4
  assert avg_error > 0.1                                        # biased ...
  assert np.abs(trajectory[-1] - trajectory[-2]).max() < 1e-4    # ... and stalled


def reference_feddyn(p, cohorts, theta0, alpha, gamma, steps, adaptive=False,
                     wd_form=False, weight_decay=0.0, clip=None, report=False):
  """Paper 003 Algorithm 1 (+ reference-code options) in float64 numpy."""
  m = p.num_clients
  sizes = np.array([len(y) for y in p.Y], np.float64)
  theta, h = np.array(theta0, np.float64), np.zeros(p.dim)
  g = {k: np.zeros(p.dim) for k in range(m)}
  devices = {k: theta.copy() for k in range(m)}
  clipped = False

  def clip_fn(v):
    nonlocal clipped
    norm = np.linalg.norm(v)
    if clip is not None and norm > clip:
      clipped = True
      return v * clip / norm
    return v

  for cohort in cohorts:
    deltas = []
    for k in cohort:
      a_k = alpha * sizes.mean() / sizes[k] if adaptive else alpha
      y = theta.copy()
      for _ in range(steps):
        raw = p.grad(k, y)
        if wd_form:
          grad = clip_fn(raw - g[k] - a_k * theta) + (a_k + weight_decay) * y
        else:
          grad = clip_fn(raw - g[k] + a_k * (y - theta)) + weight_decay * y
        y = y - gamma * grad
      d = y - theta
      devices[k] = y
      g[k] = g[k] - a_k * d
      deltas.append(d)
    h = h - alpha / m * np.sum(deltas, axis=0)
    theta = theta + np.mean(deltas, axis=0) - h / alpha
  return theta, h, g, clipped, np.mean(list(devices.values()), axis=0)


@pytest.mark.parametrize('options', [
    dict(),
    dict(adaptive=True, wd_form=True, weight_decay=0.01, clip=2.0),
    dict(adaptive=True, wd_form=False, weight_decay=0.0, clip=2.0, report=True),
])
def test_feddyn_follows_the_update_equations(options):
  # Unequal client sizes, partial participation, two rounds; client 3 never
  # participates and client 0 sits out round 2 (their states must not move).
  p = Problem(sizes=[4, 6, 8, 10], seed=3)
  cohorts = [[0, 1], [2, 1]]
  theta0 = np.array([0.5, -1.0, 2.0])
  alpha, gamma, steps = 0.5, 0.05, 3
  config = feddyn.FedDynConfig(alpha=alpha, client_learning_rate=gamma, local_steps=steps,
      adaptive_alpha=options.get('adaptive', False),
      weight_decay_form=options.get('wd_form', False),
      client_weight_decay=options.get('weight_decay', 0.0), clip_norm=options.get('clip'),
      report_device_average=options.get('report', False))
  algorithm = feddyn.build_feddyn(p.model_fn, config)
  sizes = [len(y) for y in p.Y]
  state, states = run_stateful(algorithm.process, p, cohorts, theta0,
                               Population(4, float(np.mean(sizes))))
  theta, h, g, clipped, device_average = reference_feddyn(
      p, cohorts, theta0, alpha, gamma, steps, **options)
  if options.get('clip'):
    assert clipped  # the clipping branch was exercised
  server_model = np.asarray(algorithm.process.server_model(state).trainable[0])
  np.testing.assert_allclose(server_model, theta, rtol=1e-5, atol=1e-5)
  if options.get('report'):  # the reported model is the mean of all 4 devices
    np.testing.assert_allclose(model(algorithm.process, state), device_average,
                               rtol=1e-5, atol=1e-5)
    assert np.abs(device_average - theta).max() > 1e-2
    state = dict(state, algorithm=state['algorithm']['algorithm'])
    states = {k: s['algorithm'] for k, s in states.items()}
  else:
    np.testing.assert_allclose(model(algorithm.process, state), theta, rtol=1e-5,
                               atol=1e-5)
  np.testing.assert_allclose(np.asarray(state['algorithm']['h'][0]), h, rtol=1e-5,
                             atol=1e-6)
  for k in range(4):
    np.testing.assert_allclose(np.asarray(states[k][0]), g[k], rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(states[3][0]) == 0)
  assert np.abs(h).max() > 1e-3 and np.abs(g[0]).max() > 1e-3


def test_a_diverging_client_is_dropped_and_keeps_its_state():
  # Client 2's data holds a NaN: its update is non-finite. The round must equal
  # one without it (h still divides by all m = 4 clients) and its state stays.
  p = Problem(seed=7)
  p.Y[2] = p.Y[2].copy()
  p.Y[2][0] = np.nan
  algorithm = feddyn.build_feddyn(p.model_fn, feddyn.FedDynConfig(
      alpha=0.5, client_learning_rate=0.05, local_steps=3))
  process = algorithm.process
  with_bad, states = run_stateful(process, p, [[0, 1, 2], [2, 0]], np.ones(3))
  without, ref_states = run_stateful(process, p, [[0, 1], [0]], np.ones(3))
  np.testing.assert_allclose(model(process, with_bad), model(process, without),
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(with_bad['algorithm']['h'][0]),
                             np.asarray(without['algorithm']['h'][0]), rtol=1e-6, atol=1e-7)
  assert np.all(np.asarray(states[2][0]) == 0)
  np.testing.assert_allclose(np.asarray(states[0][0]), np.asarray(ref_states[0][0]),
                             rtol=1e-6, atol=1e-7)
  state = process.set_model_weights(process.initialize(Population(4)), p.weights(np.ones(3)))
  init = process.initial_client_state(state)
  out = process.next(state, p.datasets([2]), [init])
  assert out.metrics['client_work']['non_finite_clients'] == 1
  np.testing.assert_array_equal(model(process, out.state), np.ones(3))  # unchanged


def test_feddyn_traffic_is_one_model_each_way_and_excludes_client_state():
  p = Problem(dim=50)
  algorithm = feddyn.build_feddyn(p.model_fn, feddyn.FedDynConfig(local_steps=1))
  traffic = algorithm.traffic
  assert traffic.model_bytes == 200
  # model + broadcast hparams (a few scalars); update + stats + loss metric.
  assert 200 <= traffic.download_bytes < 200 + 32
  assert 200 <= traffic.upload_bytes < 200 + 32
  # Reporting the average of all device models costs one more upload.
  traffic = feddyn.build_feddyn(p.model_fn, feddyn.FedDynConfig(
      local_steps=1, report_device_average=True)).traffic
  assert 200 <= traffic.download_bytes < 200 + 32
  assert 400 <= traffic.upload_bytes < 400 + 32


def test_feddyn_flags_validate_early():
  algorithm_flags.check('feddyn', HParams(feddyn_alpha=0.1, clip_norm=10.0))
  for bad in (HParams(feddyn_alpha=0.0), HParams(clip_norm=-1.0),
              HParams(client_optimizer='adam'), HParams(server_learning_rate=0.5),
              HParams(client_weight_decay=-1.0)):
    with pytest.raises(ValueError):
      algorithm_flags.check('feddyn', bad)


# -- exact resume through the trainer -------------------------------------------
@pytest.fixture(scope='module')
def digits():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=10, model='logistic'))


@pytest.fixture(scope='module')
def digits_feddyn(digits):
  return algorithm_flags.build('feddyn', digits.model_fn, HParams(
      local_steps=3, client_learning_rate=0.1, feddyn_alpha=0.1,
      feddyn_adaptive_alpha=True, clip_norm=10.0))


def config(out, rounds, every):
  return training.RunConfig(total_rounds=rounds, clients_per_round=5, seed=0,
                            rounds_per_eval=0, rounds_per_checkpoint=every,
                            output_dir=out, progress=False)


def store_rows(out, task):
  store = client_state.ClientStateStore(f'{out}/client_state', task.client_ids,
                                        [np.zeros((64, 10), np.float32),
                                         np.zeros(10, np.float32)])
  rows = store.gather(task.client_ids)
  store.close()
  return rows


def weights(result):
  return [np.asarray(w) for w in result.model_weights.trainable]


def test_feddyn_resume_is_exact_even_after_rounds_past_the_checkpoint(
    digits, digits_feddyn, tmp_path):
  full = training.run_training(digits_feddyn, digits, config(str(tmp_path / 'full'), 6, 6))

  # Stop at round 3, resume to 6.
  out = str(tmp_path / 'stopped')
  training.run_training(digits_feddyn, digits, config(out, 3, 3))
  resumed = training.run_training(digits_feddyn, digits, config(out, 6, 3))
  assert resumed.resumed_from == 3

  # Die during round 5 with the last checkpoint at round 4: the store already
  # holds round 5's client states, which must be undone on resume.
  crashed = str(tmp_path / 'crashed')

  def die_at_5(done, state, row):
    if done == 5:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    training.run_training(digits_feddyn, digits, config(crashed, 6, 2),
                          round_callback=die_at_5)
  ids = digits.client_ids
  before = {c for r in range(4) for c in sampling.sample_clients(ids, 5, 0, r)}
  assert before & set(sampling.sample_clients(ids, 5, 0, 4))  # rows were overwritten
  after_crash = training.run_training(digits_feddyn, digits, config(crashed, 6, 2))
  assert after_crash.resumed_from == 4

  reference = weights(full)
  for result in (resumed, after_crash):
    for a, b in zip(weights(result), reference):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  full_rows = store_rows(str(tmp_path / 'full'), digits)
  for out_dir in (out, crashed):
    for a, b in zip(store_rows(out_dir, digits), full_rows):
      for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
  # Some client states moved, and clients never sampled kept theirs (zero).
  sampled = {c for r in range(6) for c in sampling.sample_clients(ids, 5, 0, r)}
  rows = dict(zip(ids, full_rows))
  assert any(np.abs(rows[c][0]).max() > 1e-4 for c in sampled)
  never = set(ids) - sampled
  assert never and all(np.all(rows[c][0] == 0) for c in never)


def test_without_adaptive_alpha_the_client_trains_on_its_first_reshuffle():
  """alpha_k = alpha needs no n_k, so no counting pass runs before training: on
  a dataset reshuffled at every pass, the client's one epoch is the FIRST
  order. From g_k = 0 that epoch equals FedProx's with mu = alpha (same
  arithmetic, g - 0 + alpha (theta - theta_t)), run on a fresh copy of the
  dataset; a counting pass would have left training the second order."""
  import tensorflow as tf
  import tensorflow_federated as tff
  from least_squares import LeastSquaresModel
  from tff_algos.algorithms import fedprox
  from tff_algos.core import local_training

  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=8).astype(np.float32)
  alpha, gamma = 0.5, 0.1
  hparams = dict(learning_rate=tf.constant(gamma), num_steps=tf.constant(-1),
                 num_epochs=tf.constant(1))

  def dataset():  # built inside each function: a fresh reshuffling sequence
    return tf.data.Dataset.from_tensor_slices(dict(x=x, y=y)).shuffle(
        8, seed=1, reshuffle_each_iteration=True).batch(2)

  def start():
    model = LeastSquaresModel(3)
    return model, tff.learning.models.ModelWeights(
        trainable=[tf.constant([0.3, -0.2, 0.1])], non_trainable=[])

  model, w0 = start()
  fns = feddyn.stateful_fns(feddyn.FedDynConfig(alpha=alpha, client_learning_rate=gamma))
  dyn = tf.function(lambda: fns.client_update(
      model, w0, hparams, dataset(), [tf.zeros(3)], tf.constant(4.0)).upload)()

  def prox_epoch(skip_a_pass):
    prox_model, _ = start()

    @tf.function
    def run():
      ds = dataset()
      if skip_a_pass:
        local_training.count_examples(ds)
      return local_training.run_scheduled(
          prox_model, tff.learning.optimizers.build_sgdm(gamma), hparams, w0, ds,
          correction_fn=fedprox.proximal_correction(alpha)(w0)).delta
    return -np.asarray(run()[0])

  np.testing.assert_array_equal(np.asarray(dyn[0]), prox_epoch(skip_a_pass=False))
  assert not np.allclose(np.asarray(dyn[0]), prox_epoch(skip_a_pass=True))


def test_weight_decay_form_adds_the_linear_term_formed_once():
  """The weight-decay form's step in the reference code's order: the constant
  -(g_k + alpha_k theta_{t-1}) formed once per client, then grad + it at each
  step, clipped, plus (alpha_k + weight_decay) theta (docs/papers/paper003.md). Before,
  each step formed (grad - g_k) - alpha_k theta_{t-1}, which rounds differently."""
  import tensorflow as tf
  rng = np.random.default_rng(0)
  g, g_k, srv, w = (rng.normal(size=1000).astype(np.float32) for _ in range(4))
  alpha_k = np.float32(0.3)
  linear = feddyn.linear_term([tf.constant(g_k)], [tf.constant(srv)], tf.constant(alpha_k))
  np.testing.assert_array_equal(linear[0], -(g_k + alpha_k * srv))
  config = feddyn.FedDynConfig(weight_decay_form=True, client_weight_decay=0.01)
  got = feddyn.local_gradient(config, [tf.constant(g)], [tf.constant(w)], None, None,
                              tf.constant(alpha_k), linear)
  decay = np.float32(alpha_k + np.float32(0.01))
  np.testing.assert_array_equal(got[0], (g + linear[0].numpy()) + decay * w)
  assert np.any(g + -(g_k + alpha_k * srv) != (g - g_k) - alpha_k * srv)
