"""FedMAX: beta = 0 is FedAvg, the entropy term's gradient, model coverage."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import TaskOptions
from tasks import base, embedded, models
from tff_algos.algorithms import fedmax, fedopt
from tff_algos.core import optimizers
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams


def softmax(a):
  e = np.exp(a - a.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_max_entropy_kl_values():
  a = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 4.0]], np.float32)
  q = softmax(a.astype(np.float64))
  forward = np.mean(np.sum(q * np.log(q * 3), -1))
  reverse = np.mean(np.sum((1 / 3) * np.log((1 / 3) / q), -1))
  assert float(fedmax.max_entropy_kl(a)) == pytest.approx(forward, rel=1e-5)
  assert float(fedmax.max_entropy_kl(a, reference_kl=True)) == pytest.approx(reverse, rel=1e-5)
  assert float(fedmax.max_entropy_kl(a[:1])) == pytest.approx(0.0, abs=1e-7)


@pytest.fixture(scope='module')
def task():
  return embedded.build(TaskOptions(batch_size=16, num_clients=12, model='mlp'))


@pytest.mark.parametrize('reference_kl', [False, True])
def test_entropy_term_gradient_matches_numpy(task, reference_kl):
  beta = 0.7
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  plain = task.model_fn()
  model = fedmax.fedmax_model_fn(task.model_fn, beta, reference_kl)()
  tf.random.set_seed(3)
  weights = [np.random.default_rng(i).normal(0, 0.3, v.shape).astype(np.float32)
             for i, v in enumerate(plain.trainable_variables)]
  grads = {}
  for name, m in (('plain', plain), ('fedmax', model)):
    for v, w in zip(m.trainable_variables, weights):
      v.assign(w)
    with tf.GradientTape() as tape:
      loss = m.forward_pass(batch, training=True).loss
    grads[name] = [g.numpy() for g in tape.gradient(loss, m.trainable_variables)]

  # d/da of beta * mean_b KL at the 128 ReLU activations a = relu(x W1 + b1).
  x = batch['x'].numpy().astype(np.float64)
  z = x @ weights[0] + weights[1]
  a = np.maximum(z, 0)
  q = softmax(a)
  if reference_kl:   # KL(U || q) = -log d - mean_j log q_j
    dkl = q - 1.0 / a.shape[1]
  else:              # KL(q || U) = sum_j q_j log q_j + log d
    dkl = q * (np.log(q) - np.sum(q * np.log(q), -1, keepdims=True))
  dz = beta * dkl * (z > 0) / len(x)
  expected = [x.T @ dz, dz.sum(0), 0 * weights[2], 0 * weights[3]]
  for g_max, g_plain, e in zip(grads['fedmax'], grads['plain'], expected):
    np.testing.assert_allclose(g_max - g_plain, e, atol=2e-6)
  assert np.abs(expected[0]).max() > 1e-4   # the term is not negligible here
  # The reported training loss stays the plain loss.
  assert float(model.report_local_unfinalized_metrics()['loss'][0]) == pytest.approx(
      float(plain.report_local_unfinalized_metrics()['loss'][0]), rel=1e-5)


def test_beta_zero_is_fedavg_exactly(task):
  config = dict(client_learning_rate=0.1, local_steps=3)
  avg = fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(**config))
  fmax0 = fedmax.build_fedmax(task.model_fn, fedmax.FedMaxConfig(beta=0.0, **config))
  fmax = fedmax.build_fedmax(task.model_fn, fedmax.FedMaxConfig(beta=5.0, **config))
  assert fmax.traffic == avg.traffic   # download x, upload x (paper 004 Table 1)
  data = [task.client_dataset(c) for c in task.client_ids[:3]]
  tf.keras.utils.set_random_seed(0)
  m = task.model_fn()
  init = tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in m.trainable_variables], non_trainable=[])
  finals = []
  for alg in (avg, fmax0, fmax):
    state = alg.process.set_model_weights(alg.process.initialize(), init)
    for _ in range(2):
      state = alg.process.next(state, data).state
    finals.append([np.asarray(w) for w in alg.process.get_model_weights(state).trainable])
  for x, y in zip(finals[0], finals[1]):
    np.testing.assert_array_equal(x, y)
  assert max(np.abs(x - y).max() for x, y in zip(finals[0], finals[2])) > 1e-4


def test_femnist_cnn_exposes_its_512_unit_layer():
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  model_fn = base.logits_classifier_fn(lambda: models.femnist_cnn(62), spec)
  model = fedmax.fedmax_model_fn(model_fn, 2.0)()
  keras_model = model._keras_model  # pylint: disable=protected-access
  layer = fedmax.penultimate_layer(keras_model)
  assert layer.units == 512
  x = np.random.default_rng(0).uniform(size=(4, 28, 28, 1)).astype(np.float32)
  batch = collections.OrderedDict(x=x, y=np.arange(4, dtype=np.int32))
  loss = float(model.forward_pass(batch, training=True).loss)
  act = tf.keras.Model(keras_model.inputs, layer.output)(x)
  ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
      batch['y'], keras_model(x))
  assert loss == pytest.approx(float(ce) + 2.0 * float(fedmax.max_entropy_kl(act)), rel=1e-5)


def test_linear_models_and_bad_beta_are_rejected():
  task = embedded.build(TaskOptions(batch_size=16, num_clients=12, model='logistic'))
  with pytest.raises(ValueError, match='penultimate'):
    fedmax.build_fedmax(task.model_fn)
  with pytest.raises(ValueError, match='fedmax_beta'):
    algorithm_flags.check('fedmax', HParams(fedmax_beta=-1.0))
  assert registry.get('fedmax').name == 'fedmax'
