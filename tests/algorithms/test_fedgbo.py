"""FedGBO (paper 004): FedAvg at beta = 0, exact inverse step, flag checks."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import TaskOptions, get_task
from tff_algos.algorithms import fedgbo
from tff_algos.algorithms import fedopt
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

K = 3


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='logistic'))


def run_rounds(process, data, rounds, state=None):
  state = process.initialize() if state is None else state
  for _ in range(rounds):
    state = process.next(state, data).state
  return state


def trainable(process, state):
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def _sgdm_zero_and_fedavg(task, **fedavg_options):
  """3 rounds of FedGBO with SGDm(beta = 0) and of FedAvg (SGD clients, its
  `fedavg_options`) from the same initial weights, on the same 3 clients:
  (initial weights, FedGBO's final state and weights, FedAvg's final weights)."""
  data = [task.client_dataset(cid) for cid in task.client_ids[:3]]
  gbo = fedgbo.build_fedgbo(task.model_fn, fedgbo.FedGBOConfig(optimizer=gbo_optimizers.SGDm(0.0),
      client_learning_rate=0.1, local_steps=K))
  avg = fedopt.build_fedopt(task.model_fn,
      fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=K, **fedavg_options))
  s_gbo = run_rounds(gbo.process, data, 3)
  init = gbo.process.get_model_weights(gbo.process.initialize())
  s_avg = run_rounds(avg.process, data, 3,
                     avg.process.set_model_weights(avg.process.initialize(), init))
  return init, s_gbo, trainable(gbo.process, s_gbo), trainable(avg.process, s_avg)


def test_sgdm_with_beta_zero_is_fedavg(task):
  init, _, w_gbo, w_avg = _sgdm_zero_and_fedavg(task)
  moved = max(np.abs(a - np.asarray(b)).max() for a, b in zip(w_gbo, init.trainable))
  assert moved > 1e-2
  for a, b in zip(w_gbo, w_avg):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_decaying_server_lr_reaches_the_finalizer(task, monkeypatch):
  """No flag decays eta for the statistics algorithms, but their client work
  hands eta_t to the finalizer as FedAvg's does: SGDm with beta = 0 under
  eta_t = 0.5 * 0.7^t is FedAvg with that server schedule."""
  from tff_algos.core import client_work as client_work_lib
  from tff_algos.core import schedules
  schedule = client_work_lib.client_schedule(
      0.1, 1.0, K, 1.0, 1, server_lr=schedules.ExponentialDecay(0.5, 0.7))
  monkeypatch.setattr(fedgbo.FedGBOConfig, 'client_schedule', lambda self: schedule)
  _, s_gbo, w_gbo, w_avg = _sgdm_zero_and_fedavg(
      task, server_learning_rate=0.5, server_lr_decay=0.7)
  # The finalizer's rate last set: eta_2 (the round number was 2 in round 3).
  np.testing.assert_allclose(s_gbo.finalizer['learning_rate'], 0.5 * 0.7**2, rtol=1e-6)
  for a, b in zip(w_gbo, w_avg):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


# --- the inverse step recovers the average local gradient -------------------
# Every client holds the same data, so each runs the same K steps and
# x_{t+1} = y_K; the statistics after two rounds are checked against numpy's
# T applied to the mean of the K local gradients, recomputed here outside TFF
# with numpy's U (independent formulas, paper 004 Table II).

def _np_moments(name, opt, stats):
  t = stats['count']
  m = stats.get('m')
  v = stats.get('v')
  bias = getattr(opt, 'bias_correction', False)
  if bias and name == 'adam':
    m = [x / (1 - opt.beta_1 ** t) if t else 0 * x for x in m]
  if bias:
    beta_v = opt.beta if name == 'rmsprop' else opt.beta_2
    v = [x / (1 - beta_v ** t) if t else np.ones_like(x) for x in v]
  return m, v


def _np_step(name, opt, lr, g, stats):
  m, v = _np_moments(name, opt, stats)
  if name == 'sgdm':
    return [lr * (opt.beta * mi + (1 - opt.beta) * gi) for mi, gi in zip(m, g)]
  if name == 'rmsprop':
    return [lr * gi / (np.sqrt(vi) + opt.epsilon) for gi, vi in zip(g, v)]
  return [lr * (opt.beta_1 * mi + (1 - opt.beta_1) * gi) / (np.sqrt(vi) + opt.epsilon)
          for gi, mi, vi in zip(g, m, v)]


def _np_track(name, opt, stats, ghat):
  new = dict(count=stats['count'] + 1)
  b1 = opt.beta if name == 'sgdm' else getattr(opt, 'beta_1', None)
  b2 = opt.beta if name == 'rmsprop' else getattr(opt, 'beta_2', None)
  if 'm' in stats:
    new['m'] = [b1 * m + (1 - b1) * g for m, g in zip(stats['m'], ghat)]
  if 'v' in stats:
    new['v'] = [b2 * v + (1 - b2) * g * g for v, g in zip(stats['v'], ghat)]
  return new


def _local_gradients(task, weights, dataset, name, opt, lr, stats, num_steps=K):
  """K steps of U outside TFF; returns the K minibatch gradients."""
  model = task.model_fn()
  for var, w in zip(model.trainable_variables, weights):
    var.assign(w)
  grads = []
  for batch in dataset.repeat().take(num_steps):
    with tf.GradientTape() as tape:
      loss = model.forward_pass(batch, training=True).loss
    g = [x.numpy() for x in tape.gradient(loss, model.trainable_variables)]
    grads.append(g)
    for var, step in zip(model.trainable_variables, _np_step(name, opt, lr, g, stats)):
      var.assign(var.numpy() - step.astype(np.float32))
  return grads


def _relative_error(a, b):
  a = np.concatenate([np.ravel(x) for x in a])
  b = np.concatenate([np.ravel(x) for x in b])
  return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize('name,lr,reference,decay', [
    ('sgdm', 0.1, False, 1.0), ('rmsprop', 0.01, False, 1.0), ('adam', 0.01, False, 1.0),
    ('adam', 0.01, True, 1.0),
    # Decaying K_t = ceil(3 * .5^t) and eta_t = eta .5^t: the inverse uses the round's.
    ('adam', 0.01, False, 0.5)])
def test_inverse_step_recovers_average_local_gradient(task, name, lr, reference, decay):
  opt = gbo_optimizers.build(name, beta_1=0.5 if name == 'sgdm' else None,
                             reference_conventions=reference)
  dataset = task.client_dataset(task.client_ids[0])
  alg = fedgbo.build_fedgbo(task.model_fn, fedgbo.FedGBOConfig(optimizer=opt,
      client_learning_rate=lr, local_steps=K, local_steps_decay=decay, client_lr_decay=decay))
  # x_0 = 0: the moves x_t - x_{t+1} are then not small differences of large
  # weights, so float32 rounding of x does not swamp the inverse step.
  state = alg.process.initialize()
  zeros = tf.nest.map_structure(np.zeros_like, alg.process.get_model_weights(state))
  state = alg.process.set_model_weights(state, zeros)
  raw = state.client_work['statistics']
  stats = {k: (v if k == 'count' else [np.asarray(x) for x in v]) for k, v in raw.items()}
  for t in range(2):
    weights = trainable(alg.process, state)
    grads = _local_gradients(task, weights, dataset, name, opt, lr * decay**t, stats,
                             num_steps=int(np.ceil(K * decay**t)))
    assert len(grads) == (K if decay == 1 else [3, 2][t])
    ghat = [np.mean(gs, axis=0) for gs in zip(*grads)]
    stats = _np_track(name, opt, stats, ghat)
    state = alg.process.next(state, [dataset, dataset]).state
    got = state.client_work['statistics']
    assert int(got['count']) == stats['count']
    for key in opt.statistic_names:
      err = _relative_error([np.asarray(x) for x in got[key]], stats[key])
      assert err <= 1e-5, (key, err)
  # The statistics are not trivially zero.
  assert np.abs(np.concatenate([np.ravel(x) for x in stats[opt.statistic_names[0]]])).max() > 1e-4


@pytest.mark.parametrize('name,reference', [
    ('sgdm', False), ('rmsprop', False), ('adam', False), ('adam', True)])
@pytest.mark.parametrize('count', [0, 3])
def test_fixed_statistics_step_is_u_with_the_statistics_prepared_once(name, reference, count):
  """FixedStatistics prepares s_t once (Adam: m-hat, sqrt(v-hat) + eps) and
  then applies y <- y - U(eta, g, s_t) at every step, its state unchanged:
  numpy's U (Table II, bias correction included; identity preconditioner at
  t = 0) on two different gradients."""
  opt = gbo_optimizers.build(name, reference_conventions=reference)
  rng = np.random.default_rng(count)
  shapes = [(4, 3), (3,)]
  stats = {'count': count}
  for k in opt.statistic_names:
    stats[k] = [np.abs(rng.normal(size=s)).astype(np.float32) for s in shapes]
  tf_stats = {k: v if k == 'count' else tuple(tf.constant(x) for x in v)
              for k, v in stats.items()}
  tf_stats['count'] = tf.constant(count)
  fixed = gbo_optimizers.FixedStatistics(opt, tf_stats, learning_rate=0.05)
  state = fixed.initialize(None)
  weights = tuple(tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes)
  for _ in range(2):
    grads = [rng.normal(size=s).astype(np.float32) for s in shapes]
    state, new = fixed.next(state, weights, tuple(tf.constant(g) for g in grads))
    expected = [w.numpy() - u for w, u in zip(weights, _np_step(name, opt, 0.05, grads, stats))]
    for got, want in zip(new, expected):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    weights = new


def test_diverging_clients_leave_model_and_statistics_unchanged(task):
  """An infinite step makes every client non-finite: each gets weight 0, and
  neither x_t nor the statistics (nor their count) move."""
  data = [task.client_dataset(cid) for cid in task.client_ids[:2]]
  alg = fedgbo.build_fedgbo(task.model_fn, fedgbo.FedGBOConfig(optimizer=gbo_optimizers.Adam(),
      client_learning_rate=float('inf'), local_steps=2))
  state = alg.process.initialize()
  out = alg.process.next(state, data)
  assert out.metrics['client_work']['non_finite_clients'] == 2
  for a, b in zip(trainable(alg.process, out.state), trainable(alg.process, state)):
    np.testing.assert_array_equal(a, b)
  before, after = state.client_work['statistics'], out.state.client_work['statistics']
  assert int(after['count']) == 0
  for key in ('m', 'v'):
    for a, b in zip(after[key], before[key]):
      np.testing.assert_array_equal(a, b)


def _hp(**kwargs):
  base = dict(client_optimizer='sgdm', client_learning_rate=0.1, local_steps=5)
  base.update(kwargs)
  return HParams(**base)


@pytest.mark.parametrize('kwargs,message', [
    (dict(client_optimizer='sgd'), 'statistics'),
    (dict(client_optimizer='yogi'), 'statistics'),
    (dict(local_steps=None), 'local_steps'),
    (dict(server_optimizer='adam'), 'server'),
    (dict(client_momentum=1.0), r'--client_momentum must be in \[0, 1\)'),
    (dict(client_learning_rate=0.0), 'eta > 0'),
    (dict(client_optimizer='adam', client_epsilon=0.0), 'epsilon'),
    (dict(client_optimizer='adam', client_momentum=0.9), 'client_momentum'),
    # (Said by the optimiser check before gbo_optimizers' 'RMSProp has no first
    # moment', which a config built without the flags still says.)
    (dict(client_optimizer='rmsprop', client_beta_1=0.9),
     '--client_beta_1 is not used by --client_optimizer=rmsprop'),
    (dict(client_optimizer='adam', gbo_reference_conventions=True, client_epsilon=1e-8),
     'epsilon'),
])
def test_check_rejects_bad_hparams(kwargs, message):
  with pytest.raises(ValueError, match=message):
    algorithm_flags.check('fedgbo', _hp(**kwargs))


def test_check_accepts_each_optimizer():
  for name in gbo_optimizers.NAMES:
    for algorithm in ('fedgbo', 'mimelite', 'mimexlite', 'mfl'):
      algorithm_flags.check(algorithm, _hp(client_optimizer=name))
  config = algorithm_flags.config('fedgbo', _hp(client_optimizer='adam',
                                                 gbo_reference_conventions=True))
  assert config.plain_mean
  optimizer = gbo_optimizers.of_config(config)
  assert (optimizer.initial_v, optimizer.bias_correction, optimizer.epsilon) == (1.0, False, 1e-3)
  config = fedgbo.FedGBOConfig(client_optimizer='rmsprop', client_beta_2=0.5,
                               reference_conventions=True, local_steps=4)
  assert config.plain_mean and config.local_steps == 4
  assert gbo_optimizers.of_config(config) == gbo_optimizers.RMSProp(
      0.5, epsilon=1e-3, bias_correction=False, initial_v=1.0)
  assert gbo_optimizers.build('adam') == gbo_optimizers.Adam(
      0.9, 0.99, epsilon=1e-3, bias_correction=True, initial_v=0.0)
