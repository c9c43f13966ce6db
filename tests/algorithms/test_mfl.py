"""MFL: the client optimiser's state is downloaded, carried on and averaged.

The default optimisers are paper 004's (the authors' MFL optimisers: dampened
SGDm, RMSProp and Adam with moving statistics); `tff_optimizer` runs TFF's
own optimiser unchanged (the first tests, against TFF's Adam)."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import TaskOptions, get_task
from tff_algos.algorithms import mfl
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.core import optimizers
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

K = 3
SPEC = optimizers.OptimizerSpec('adam', 0.02)


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='logistic'))


@pytest.fixture(scope='module')
def algorithm(task):
  return mfl.build_mfl(task.model_fn, mfl.MFLConfig(tff_optimizer=SPEC, local_steps=K))


def _local_adam(task, weights, opt_state, dataset):
  """K steps of TFF's Adam outside TFF, from the given weights and state."""
  model = task.model_fn()
  optimizer = SPEC.build()
  weights = tuple(tf.constant(w) for w in weights)
  for batch in dataset.repeat().take(K):
    for var, w in zip(model.trainable_variables, weights):
      var.assign(w)
    with tf.GradientTape() as tape:
      loss = model.forward_pass(batch, training=True).loss
    grads = tuple(tape.gradient(loss, model.trainable_variables))
    opt_state, weights = optimizer.next(opt_state, weights, grads)
  return [w.numpy() for w in weights], opt_state


def _initial(task, algorithm):
  state = algorithm.process.initialize()
  weights = [np.asarray(w) for w in algorithm.process.get_model_weights(state).trainable]
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights)
  return state, weights, SPEC.build().initialize(specs)


def test_one_client_mfl_is_centralised_adam(task, algorithm):
  """With one client, averaging is the identity: MFL over two rounds is 2K
  uninterrupted Adam steps (state, including the step count, carried over)."""
  dataset = task.client_dataset(task.client_ids[0])
  state, weights, opt_state = _initial(task, algorithm)
  for _ in range(2):
    weights, opt_state = _local_adam(task, weights, opt_state, dataset)
    state = algorithm.process.next(state, [dataset]).state
  got = [np.asarray(w) for w in algorithm.process.get_model_weights(state).trainable]
  for a, b in zip(got, weights):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  server = state.client_work['statistics']
  assert int(server['step']) == 2 * K == int(opt_state['step'])
  for key in ('accumulator', 'preconditioner'):
    for a, b in zip(server[key], opt_state[key]):
      np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-9)


def test_statistics_are_the_weighted_mean_of_client_states(task, algorithm):
  """Weighted by n_i here (MFLConfig's default; the trainer's --uniform_weighting
  gives 1/M)."""
  data = [task.client_dataset(cid) for cid in task.client_ids[:2]]
  state, weights, opt_state = _initial(task, algorithm)
  finals = [_local_adam(task, weights, opt_state, d)[1] for d in data]
  sizes = [float(sum(int(b['y'].shape[0]) for b in d)) for d in data]
  assert sizes[0] != sizes[1]   # the weighting matters
  state = algorithm.process.next(state, data).state
  server = state.client_work['statistics']
  assert int(server['step']) == K
  for key in ('accumulator', 'preconditioner'):
    for i, got in enumerate(server[key]):
      expected = sum(n * f[key][i].numpy() for n, f in zip(sizes, finals)) / sum(sizes)
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-9)
      assert np.abs(expected).max() > 1e-6


@pytest.mark.parametrize('kwargs,message', [
    (dict(client_optimizer='sgd'), 'optimiser state'),
    (dict(client_optimizer='yogi'), 'optimiser state'),
    (dict(client_optimizer='sgdm', client_momentum=0.0), 'momentum'),
    (dict(server_learning_rate=0.5), 'server'),
])
def test_check_rejects_bad_hparams(kwargs, message):
  hp = dict(client_optimizer='sgdm', local_steps=5)
  hp.update(kwargs)
  with pytest.raises(ValueError, match=message):
    algorithm_flags.check('mfl', HParams(**hp))


# --- paper 004's optimisers with moving statistics ---------------------------
# Independent numpy versions of the authors' MFL optimisers (one step: the
# statistics first, then the step with the new statistics).

def _np_moving_step(name, reference, lr, b1, b2, eps, w, g, s):
  t = s['count'] + 1
  new = dict(count=t)
  if name == 'sgdm':
    new['m'] = b1 * s['m'] + (1 - b1) * g
    return w - lr * new['m'], new
  new['v'] = b2 * s['v'] + (1 - b2) * g * g
  v_hat = new['v'] if reference else new['v'] / (1 - b2 ** t)
  if name == 'rmsprop':
    return w - lr * g / (np.sqrt(v_hat) + eps), new
  new['m'] = b1 * s['m'] + (1 - b1) * g
  m_hat = new['m'] if reference else new['m'] / (1 - b1 ** t)
  return w - lr * m_hat / (np.sqrt(v_hat) + eps), new


MOVING = [('sgdm', False), ('rmsprop', True), ('adam', True), ('adam', False)]


@pytest.mark.parametrize('name,reference', MOVING)
def test_one_client_mfl_runs_the_papers_optimiser(task, name, reference):
  """One client, two rounds: 2K uninterrupted steps of the numpy optimiser, and
  the server statistics are the client's (v_0 = 1 uncorrected, or 0 corrected)."""
  lr, b1, b2, eps = 0.05, 0.6, 0.9, 1e-3
  rule = gbo_optimizers.build(name, beta_1=None if name == 'rmsprop' else b1,
                              beta_2=None if name == 'sgdm' else b2,
                              reference_conventions=reference)
  algorithm = mfl.build_mfl(task.model_fn,
      mfl.MFLConfig(optimizer=rule, client_learning_rate=lr, local_steps=K))
  dataset = task.client_dataset(task.client_ids[0])
  state = algorithm.process.initialize()
  weights = [np.asarray(w) for w in algorithm.process.get_model_weights(state).trainable]
  v0 = 1.0 if reference else 0.0
  stats = dict(count=0, m=[np.zeros_like(w) for w in weights],
               v=[np.full_like(w, v0) for w in weights])
  model = task.model_fn()
  for _ in range(2):
    for batch in dataset.repeat().take(K):
      grads = _gradients(model, weights, batch)
      steps = [_np_moving_step(name, reference, lr, b1, b2, eps, w, g,
                               dict(count=stats['count'], m=m, v=v))
               for w, g, m, v in zip(weights, grads, stats['m'], stats['v'])]
      weights = [w for w, _ in steps]
      stats = dict(count=stats['count'] + 1,
                   m=[n.get('m', m) for (_, n), m in zip(steps, stats['m'])],
                   v=[n.get('v', v) for (_, n), v in zip(steps, stats['v'])])
    state = algorithm.process.next(state, [dataset]).state
  got = [np.asarray(w) for w in algorithm.process.get_model_weights(state).trainable]
  moved = max(np.abs(a - b).max() for a, b in zip(got, _initial(task, algorithm)[1]))
  assert moved > 1e-3
  for a, b in zip(got, weights):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)
  server = state.client_work['statistics']
  assert int(server['count']) == 2 * K
  for key in rule.statistic_names:
    for a, b in zip(server[key], stats[key]):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


def _gradients(model, weights, batch):
  for var, w in zip(model.trainable_variables, weights):
    var.assign(w)
  with tf.GradientTape() as tape:
    loss = model.forward_pass(batch, training=True).loss
  return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def test_dampened_sgdm_steady_step_is_lr_times_gradient():
  """At a constant gradient g the paper's SGDm steps gamma g; TFF's undampened
  SGDm at the same flags steps gamma g / (1 - beta) (10x at beta = 0.9)."""
  lr, beta, g = 0.1, 0.9, 2.0
  ours = gbo_optimizers.MovingStatistics(gbo_optimizers.SGDm(beta), lr)
  tffs = optimizers.OptimizerSpec('sgdm', lr, momentum=beta).build()
  spec = (tf.TensorSpec((1,), tf.float32),)
  w, grad = (tf.zeros((1,)),), (tf.fill((1,), g),)
  s_ours, s_tff = ours.initialize(spec), tffs.initialize(spec)
  for _ in range(200):
    s_ours, w_ours = ours.next(s_ours, w, grad)
    s_tff, w_tff = tffs.next(s_tff, w, grad)
  np.testing.assert_allclose(-w_ours[0].numpy(), [lr * g], rtol=1e-5)
  np.testing.assert_allclose(-w_tff[0].numpy(), [lr * g / (1 - beta)], rtol=1e-5)


def test_trainer_mfl_runs_fedgbos_optimisers():
  """The flags give FedGBO's optimisers (dampened SGDm; beta_2 = 0.99, eps = 1e-3
  by default; --gbo_reference_conventions: v_0 = 1, no correction, 1/M)."""
  config = algorithm_flags.config('mfl', HParams(
      client_optimizer='sgdm', client_momentum=0.6, client_learning_rate=0.3, local_steps=5))
  assert gbo_optimizers.of_config(config) == gbo_optimizers.SGDm(0.6)
  assert config.tff_optimizer is None
  assert config.client_learning_rate == 0.3 and not config.plain_mean
  config = algorithm_flags.config('mfl', HParams(client_optimizer='adam', local_steps=5))
  assert gbo_optimizers.of_config(config) == gbo_optimizers.Adam(0.9, 0.99, epsilon=1e-3)
  config = algorithm_flags.config('mfl', HParams(client_optimizer='rmsprop', local_steps=5,
                                                 gbo_reference_conventions=True))
  assert gbo_optimizers.of_config(config) == gbo_optimizers.RMSProp(
      0.9, epsilon=1e-3, bias_correction=False, initial_v=1.0)
  assert config.plain_mean


def test_tff_sgdm_at_lr_times_one_minus_beta_is_the_dampened_sgdm():
  """The documented mapping: TFF's sgdm(gamma (1 - beta), beta) takes the same
  steps as the dampened SGDm(gamma, beta) on any gradient sequence."""
  lr, beta = 0.3, 0.8
  ours = gbo_optimizers.MovingStatistics(gbo_optimizers.SGDm(beta), lr)
  tffs = optimizers.OptimizerSpec('sgdm', lr * (1 - beta), momentum=beta).build()
  spec = (tf.TensorSpec((3,), tf.float32),)
  w_ours = w_tff = (tf.constant([1.0, -2.0, 0.5]),)
  s_ours, s_tff = ours.initialize(spec), tffs.initialize(spec)
  rng = np.random.default_rng(0)
  for _ in range(20):
    grad = (tf.constant(rng.normal(size=3), tf.float32),)
    s_ours, w_ours = ours.next(s_ours, w_ours, grad)
    s_tff, w_tff = tffs.next(s_tff, w_tff, grad)
    np.testing.assert_allclose(w_ours[0].numpy(), w_tff[0].numpy(), rtol=1e-5, atol=1e-6)
