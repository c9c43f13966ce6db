"""MFL: the client optimiser's state is downloaded, carried on and averaged."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import TaskOptions, get_task
from tff_algos import mfl
from tff_algos import registry
from tff_algos.core import optimizers
from tff_algos.hparams import HParams

K = 3
SPEC = optimizers.OptimizerSpec('adam', 0.02)


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='logistic'))


@pytest.fixture(scope='module')
def algorithm(task):
  return mfl.build_mfl(task.model_fn, mfl.MFLConfig(client_optimizer=SPEC, local_steps=K))


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
    registry.check('mfl', HParams(**hp))
