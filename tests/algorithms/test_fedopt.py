"""FedOpt against TFF's built-ins and against the optimiser formulas."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from processes import run_rounds, trainable
from tff_algos.algorithms import fedopt, groups
from tff_algos.core import optimizers

NUM_CLIENTS = 4


@pytest.fixture(scope='module')
def init_weights(task):
  tf.random.set_seed(1)
  model = task.model_fn()
  return tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_variables],
      non_trainable=[v.numpy() for v in model.non_trainable_variables])


def assert_close(a, b, atol):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=0, atol=atol)


@pytest.mark.parametrize('server', ['sgd', 'adam'])
def test_fedavg_matches_tff_build_weighted_fed_avg(task, client_data, init_weights, server):
  server_spec = optimizers.OptimizerSpec(server, 1.0 if server == 'sgd' else 0.01)
  ours = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
      client_learning_rate=0.1, **groups.optimizer_fields('server', server_spec)))
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=server_spec.build())
  s1, out1 = run_rounds(ours.process, init_weights, client_data, 3)
  s2, out2 = run_rounds(theirs, init_weights, client_data, 3)
  w1, w2 = trainable(ours.process, s1), trainable(theirs, s2)
  assert_close(w1, w2, 1e-5)
  # Training moved the model (the comparison is not between two no-ops).
  assert max(np.abs(a - b).max() for a, b in zip(w1, init_weights.trainable)) > 1e-2
  m1 = out1[-1].metrics['client_work']['train']
  m2 = out2[-1].metrics['client_work']['train']
  assert m1['num_examples'] == m2['num_examples']
  np.testing.assert_allclose(m1['loss'], m2['loss'], rtol=1e-5)


def test_fedsgd_matches_tff_build_fed_sgd(task, init_weights):
  # build_fed_sgd uses each client's whole dataset as the gradient batch; ours
  # takes one minibatch step, so give each client exactly one batch.
  data = [task.client_dataset(cid).unbatch().batch(1000)
          for cid in task.client_ids[:NUM_CLIENTS]]
  server = optimizers.OptimizerSpec('sgd', 0.5)
  ours = fedopt.build_fedsgd(task.model_fn,
      fedopt.FedSGDConfig(**groups.optimizer_fields('server', server)))
  theirs = tff.learning.algorithms.build_fed_sgd(task.model_fn,
                                                 server_optimizer_fn=server.build())
  s1, out1 = run_rounds(ours.process, init_weights, data, 3)
  s2, _ = run_rounds(theirs, init_weights, data, 3)
  assert_close(trainable(ours.process, s1), trainable(theirs, s2), 1e-5)
  assert out1[-1].metrics['client_work']['client_steps'] == NUM_CLIENTS


def _pseudo_gradient(task, init_weights, data):
  """q_1 = weighted mean client delta, read off one FedAvg round with eta = 1."""
  sgd = fedopt.build_fedopt(task.model_fn,
      fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=3))
  state, _ = run_rounds(sgd.process, init_weights, data, 2)
  return sgd, state


def _server_rounds(task, init_weights, data, spec, rounds):
  alg = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
      client_learning_rate=0.1, local_steps=3, **groups.optimizer_fields('server', spec)))
  state, _ = run_rounds(alg.process, init_weights, data, rounds)
  return trainable(alg.process, state)


@pytest.mark.parametrize('name', ['adam', 'yogi', 'adagrad'])
def test_adaptive_server_steps_match_formulas(task, client_data, init_weights, name):
  """Two rounds of FedAdam / FedYogi against the update rules in numpy.

  Round 1's pseudo-gradient q_1 comes from a FedAvg round (same clients, same
  x_0); round 2's q_2 from a FedAvg round started at the adaptive x_1.
  """
  # epsilon = 1e-3 (Reddi et al.'s tau range), not Adam's default 1e-8: with
  # 1e-8, pseudo-gradient entries near float32 resolution (q = w - w', w ~ 0.3)
  # are normalised to steps of size ~lr, so rounding noise of 1e-8 in q moved
  # one weight of 640 by 1e-4 (seen in CI). The formulas tested are the same.
  spec = optimizers.OptimizerSpec(name, 0.03, epsilon=1e-3)
  b1, b2, eps = spec.get('beta_1') or 0.0, spec.get('beta_2') or 0.0, spec.get('epsilon')
  sgd = fedopt.build_fedopt(task.model_fn,
      fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=3))

  def q_at(weights):
    state, _ = run_rounds(sgd.process, weights, client_data, 1)
    return [a - b for a, b in zip(weights.trainable, trainable(sgd.process, state))]

  x = [w.astype(np.float64) for w in init_weights.trainable]
  m = [np.zeros_like(w) for w in x]
  v = [np.full_like(w, spec.get('initial_accumulator') or 0.0) for w in x]
  for t in (1, 2):
    q = q_at(tff.learning.models.ModelWeights(
        trainable=[w.astype(np.float32) for w in x], non_trainable=[]))
    lr_t = spec.learning_rate * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    for i, g in enumerate(q):
      g = g.astype(np.float64)
      m[i] = b1 * m[i] + (1 - b1) * g
      if name == 'adagrad':  # Keras: v <- v + g^2, x <- x - lr g / (sqrt(v) + eps)
        v[i] = v[i] + g ** 2
        x[i] = x[i] - spec.learning_rate * g / (np.sqrt(v[i]) + eps)
        continue
      if name == 'adam':
        v[i] = b2 * v[i] + (1 - b2) * g ** 2
      else:  # Yogi: v <- v - (1 - b2) g^2 sign(v - g^2)
        v[i] = v[i] - (1 - b2) * g ** 2 * np.sign(v[i] - g ** 2)
      x[i] = x[i] - lr_t * m[i] / (np.sqrt(v[i]) + eps)
  got = _server_rounds(task, init_weights, client_data, spec, 2)
  assert_close(got, x, 2e-5)


def _one_step(spec, weight, gradient):
  opt = spec.build()
  w = [tf.constant([weight], tf.float32)]
  state = opt.initialize([tf.TensorSpec([1], tf.float32)])
  _, new = opt.next(state, w, [tf.constant([gradient], tf.float32)])
  return float(new[0][0])


def test_adagrad_puts_epsilon_outside_the_square_root():
  """One coordinate, one step from a zero accumulator, g = eps = 1e-2, lr = 1:
  Keras/Reddi et al. step g / (|g| + eps) = 0.5; TFF's g / sqrt(g^2 + eps) = 0.0995."""
  keras = optimizers.OptimizerSpec('adagrad', 1.0, epsilon=1e-2, initial_accumulator=0.0)
  tff_form = optimizers.OptimizerSpec('adagrad_tff', 1.0, epsilon=1e-2,
                                      initial_accumulator=0.0)
  assert _one_step(keras, 0.0, 1e-2) == pytest.approx(-0.5, rel=1e-6)
  assert _one_step(tff_form, 0.0, 1e-2) == pytest.approx(-0.01 / np.sqrt(1e-4 + 1e-2),
                                                         rel=1e-6)
  # The accumulator grows: a second equal gradient steps g / (sqrt(2) |g| + eps).
  opt = keras.build()
  state = opt.initialize([tf.TensorSpec([1], tf.float32)])
  w = [tf.constant([0.0])]
  for _ in range(2):
    state, w = opt.next(state, w, [tf.constant([1e-2])])
  assert float(w[0][0]) == pytest.approx(-0.5 - 0.01 / (np.sqrt(2) * 0.01 + 0.01), rel=1e-6)
  # TFF's learning-rate schedule sees the same hparams as TFF's Adagrad.
  assert set(opt.get_hparams(state)) == {'learning_rate', 'epsilon'}
  assert float(opt.set_hparams(state, {'learning_rate': 0.5})['learning_rate']) == 0.5


def test_decay_schedules_reach_clients(task, client_data, init_weights):
  config = fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=4, local_steps_decay=0.5,
      client_lr_decay=0.9, server_learning_rate=1.0, server_lr_decay=0.8)
  alg = fedopt.build_fedopt(task.model_fn, config)
  state, outs = run_rounds(alg.process, init_weights, client_data, 4)
  cw = [o.metrics['client_work'] for o in outs]
  assert [int(c['local_steps']) for c in cw] == [4, 2, 1, 1]
  assert [int(c['client_steps']) for c in cw] == [4 * NUM_CLIENTS, 2 * NUM_CLIENTS,
                                                  NUM_CLIENTS, NUM_CLIENTS]
  np.testing.assert_allclose([c['client_learning_rate'] for c in cw],
                             [0.1 * 0.9 ** t for t in range(4)], rtol=1e-6)
  np.testing.assert_allclose([c['server_learning_rate'] for c in cw],
                             [0.8 ** t for t in range(4)], rtol=1e-6)
  # The finalizer's optimiser ran round 3 at eta_3.
  np.testing.assert_allclose(state.finalizer['learning_rate'], 0.8 ** 3, rtol=1e-6)


def test_rejected_rounds_do_not_shift_the_server_schedule(task, client_data, init_weights):
  """eta_t follows the round number even when rounds are rejected (non-finite)."""
  alg = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(client_learning_rate=float('inf'),
      local_steps=5, server_learning_rate=1.0, server_lr_decay=0.5))
  state, outs = run_rounds(alg.process, init_weights, client_data, 3)
  assert [int(o.metrics['finalizer']['update_non_finite']) for o in outs] == [1, 1, 1]
  assert_close(trainable(alg.process, state), init_weights.trainable, 0.0)
  np.testing.assert_allclose(state.finalizer['learning_rate'], 0.5 ** 2, rtol=1e-6)


def test_server_lr_schedule_applies_eta_t(task, client_data, init_weights):
  """With d_eta, round t's step is eta_0 d^t times the pseudo-gradient."""
  base = fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=2)
  plain = fedopt.build_fedopt(task.model_fn, base)
  decayed = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
      client_learning_rate=base.client_learning_rate, local_steps=2, server_lr_decay=0.5))
  # Round 0 has eta_0 = 1 for both; round 1 of `decayed` uses eta = 0.5.
  s_plain, _ = run_rounds(plain.process, init_weights, client_data, 1)
  x1 = tff.learning.models.ModelWeights(trainable=trainable(plain.process, s_plain),
                                        non_trainable=[])
  s_plain2, _ = run_rounds(plain.process, x1, client_data, 1)
  q2 = [a - b for a, b in zip(x1.trainable, trainable(plain.process, s_plain2))]
  s_dec, _ = run_rounds(decayed.process, init_weights, client_data, 2)
  expected = [a - 0.5 * q for a, q in zip(x1.trainable, q2)]
  assert_close(trainable(decayed.process, s_dec), expected, 1e-5)


def test_non_finite_update_leaves_server_state_unchanged(task, client_data, init_weights):
  alg = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(client_learning_rate=float('inf'),
      local_steps=5, server_optimizer='adam', server_learning_rate=0.01))
  state0 = alg.process.set_model_weights(alg.process.initialize(), init_weights)
  out = alg.process.next(state0, client_data)
  cw = out.metrics['client_work']
  assert cw['non_finite_clients'] == NUM_CLIENTS
  assert out.metrics['finalizer']['update_non_finite'] == 1
  assert_close(trainable(alg.process, out.state), init_weights.trainable, 0.0)
  for a, b in zip(tf.nest.flatten(out.state.finalizer), tf.nest.flatten(state0.finalizer)):
    np.testing.assert_array_equal(a, b)


def test_traffic_counts_model_and_broadcast(task):
  alg = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(local_steps=2))
  n_params = 64 * 10 + 10
  assert alg.traffic.model_bytes == 4 * n_params
  # Down: weights + (gamma_t, K_t, E); up: update + weight + metrics + counters.
  assert alg.traffic.download_bytes == 4 * n_params + 3 * 4
  assert 1.0 < alg.traffic.upload_models < 1.1


def test_k_step_clients_are_weighted_by_dataset_size(task, init_weights):
  """Paper 000 Alg. 1: q_t = sum_i |D_i| Delta_i / sum_i |D_i|, also with K steps."""
  ids = task.client_ids[:2]
  data = [task.client_dataset(c) for c in ids]
  sizes = [len(task.train_data.client_arrays(c)['y']) for c in ids]
  assert sizes[0] != sizes[1]
  cfg = dict(client_learning_rate=0.1, local_steps=3)
  both = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(**cfg))
  state, _ = run_rounds(both.process, init_weights, data, 1)
  deltas = []
  for d in data:
    s, _ = run_rounds(both.process, init_weights, [d], 1)
    deltas.append([a - b for a, b in zip(init_weights.trainable, trainable(both.process, s))])
  expected = [w - (sizes[0] * d0 + sizes[1] * d1) / sum(sizes)
              for w, d0, d1 in zip(init_weights.trainable, *deltas)]
  assert_close(trainable(both.process, state), expected, 1e-6)


class _NeedsAutoGraph(tff.learning.optimizers.Optimizer):
  """SGD whose `next` branches in Python on a tensor (traceable only with AutoGraph)."""

  def initialize(self, specs):
    return collections.OrderedDict(learning_rate=tf.constant(0.5))

  def next(self, state, weights, gradients):
    if tf.reduce_sum(gradients[0]) > 0:
      step = state['learning_rate']
    else:
      step = 2 * state['learning_rate']
    return state, tf.nest.map_structure(lambda w, g: w - step * g, weights, gradients)

  def get_hparams(self, state):
    return state

  def set_hparams(self, state, hparams):
    return hparams


@pytest.mark.parametrize('name', ['sgd', 'sgdm', 'adam', 'yogi', 'adagrad', 'adaptive_gd',
                                  'needs_autograph'])
def test_finalizer_without_autograph_equals_tffs(name):
  """core.finalizer's copy of TFF's finalizer: same types, and the same state,
  weights and measurements bit for bit over finite and non-finite updates."""
  from tff_algos.algorithms.nastya import adaptive_step
  from tff_algos.core import finalizer
  optimizer = dict(
      sgd=lambda: tff.learning.optimizers.build_sgdm(0.3),
      sgdm=lambda: tff.learning.optimizers.build_sgdm(0.3, momentum=0.9),
      adam=lambda: tff.learning.optimizers.build_adam(0.01),
      yogi=lambda: tff.learning.optimizers.build_yogi(0.01),
      adagrad=lambda: tff.learning.optimizers.build_adagrad(0.1),
      adaptive_gd=lambda: adaptive_step.AdaptiveGD(0.1),
      needs_autograph=_NeedsAutoGraph)[name]()
  weights_type = tff.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [3, 2]), tff.TensorType(np.float32, [2])],
      non_trainable=[tff.TensorType(np.float32, [1])]))
  ours = finalizer.build_apply_optimizer_finalizer(optimizer, weights_type)
  theirs = tff.learning.templates.build_apply_optimizer_finalizer(optimizer, weights_type)
  assert ours.next.type_signature.is_equivalent_to(theirs.next.type_signature)
  assert ours.get_hparams.type_signature.is_equivalent_to(theirs.get_hparams.type_signature)
  rng = np.random.default_rng(0)
  weights = tff.learning.models.ModelWeights(
      trainable=[rng.normal(size=(3, 2)).astype(np.float32),
                 rng.normal(size=2).astype(np.float32)],
      non_trainable=[np.ones(1, np.float32)])
  states = [ours.initialize(), theirs.initialize()]
  outs = [weights, weights]
  for step in range(5):
    update = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
    if step == 2:
      update[1][0] = np.nan
    results = [process.next(state, out, update)
               for process, state, out in zip((ours, theirs), states, outs)]
    flat = [tf.nest.flatten((r.state, r.result, r.measurements)) for r in results]
    assert len(flat[0]) == len(flat[1])
    for a, b in zip(*flat):
      np.testing.assert_array_equal(a, b)
    assert int(results[0].measurements['update_non_finite']) == (step == 2)
    states = [r.state for r in results]
    outs = [r.result for r in results]
  hparams = ours.get_hparams(states[0])
  pairs = [(hparams, theirs.get_hparams(states[1])),
           (ours.set_hparams(states[0], hparams), theirs.set_hparams(states[1], hparams))]
  for a, b in pairs:
    assert len(tf.nest.flatten(a)) == len(tf.nest.flatten(b))
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
      np.testing.assert_array_equal(x, y)


def test_finalizer_refuses_a_rejection_that_is_not_a_scalar_bool():
  """A custom `should_reject_update` giving a non-scalar or non-bool tensor is
  refused at build, as TFF's AutoGraph `if` refuses it (a tf.cond on it would
  abort the process at the first step)."""
  from tff_algos.core import finalizer
  weights_type = tff.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [2])], non_trainable=[]))
  for flag in (lambda: tf.constant([True, False]), lambda: tf.constant(1)):
    with pytest.raises(ValueError, match='scalar tf.bool'):
      finalizer.build_apply_optimizer_finalizer(
          tff.learning.optimizers.build_sgdm(0.1), weights_type,
          lambda state, update, flag=flag: (flag(), collections.OrderedDict()))
  python_int = finalizer.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(0.1), weights_type,
      lambda state, update: (1, collections.OrderedDict()))  # truthy: always rejected
  out = python_int.next(python_int.initialize(),
                        tff.learning.models.ModelWeights([np.ones(2, np.float32)], []),
                        [np.ones(2, np.float32)])
  np.testing.assert_array_equal(out.result.trainable[0], np.ones(2, np.float32))


def test_token_weighting_weights_each_client_by_its_nonzero_targets(task, client_data,
                                                                      init_weights):
  """--token_weighting (Reddi et al.'s num_tokens): the round's model is the mean
  of the clients' one-client models weighted by their targets != 0 (here: digit
  labels other than 0), not by their examples."""
  alg = fedopt.build_fedopt(task.model_fn, fedopt.FedAvgConfig(client_learning_rate=0.1,
      client_epochs_per_round=1, token_weighting=True))
  pair = client_data[:2]
  alone = [trainable(alg.process, run_rounds(alg.process, init_weights, [d], 1)[0])
           for d in pair]
  both = trainable(alg.process, run_rounds(alg.process, init_weights, pair, 1)[0])

  def targets(d):
    return np.concatenate([np.asarray(b['y'] if isinstance(b, dict) else b[1]) for b in d])
  tokens = [np.count_nonzero(targets(d)) for d in pair]
  examples = [len(targets(d)) for d in pair]
  assert tokens[0] * examples[1] != tokens[1] * examples[0]  # the two weightings differ
  expected = [(tokens[0] * a + tokens[1] * b) / sum(tokens) for a, b in zip(*alone)]
  assert_close(both, expected, 1e-6)
  by_examples = [(examples[0] * a + examples[1] * b) / sum(examples) for a, b in zip(*alone)]
  assert max(np.abs(x - y).max() for x, y in zip(both, by_examples)) > 1e-5
  with pytest.raises(ValueError, match='exclude each other'):
    fedopt.FedAvgConfig(uniform_weighting=True, token_weighting=True)
