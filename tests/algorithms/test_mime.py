"""Mimelite against TFF's build_weighted_mime_lite; MimeXlite's one-batch gradient."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from processes import trainable
from tff_algos.algorithms import mime
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers

NUM_CLIENTS = 3


def test_mimelite_matches_tff_build_weighted_mime_lite(task, client_data):
  """One epoch per round, n_i weights, server SGD at 1 in both.

  TFF's SGDm is m <- beta m + g, y <- y - lr (beta m + g); ours (paper 004)
  m <- beta m + (1-beta) g, y <- y - eta (beta m + (1-beta) g): the same
  algorithm with lr = eta (1 - beta) and m_ours = (1 - beta) m_TFF.
  """
  eta, beta = 0.5, 0.9
  ours = mime.build_mime(task.model_fn, mime.MimeConfig(
      optimizer=gbo_optimizers.SGDm(beta), client_learning_rate=eta, local_steps=None,
      client_epochs_per_round=1))
  theirs = tff.learning.algorithms.build_weighted_mime_lite(
      task.model_fn, base_optimizer=tff.learning.optimizers.build_sgdm(
          eta * (1 - beta), momentum=beta))
  s1 = ours.process.initialize()
  init = ours.process.get_model_weights(s1)
  s2 = theirs.set_model_weights(theirs.initialize(), init)
  for _ in range(3):
    out1 = ours.process.next(s1, client_data)
    out2 = theirs.next(s2, client_data)
    s1, s2 = out1.state, out2.state
  w1, w2 = trainable(ours.process, s1), trainable(theirs, s2)
  assert max(np.abs(a - np.asarray(b)).max() for a, b in zip(w1, init.trainable)) > 1e-2
  for a, b in zip(w1, w2):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  m_ours = s1.client_work['statistics']['m']
  m_tff = s2.client_work[0]['accumulator']
  assert np.abs(np.asarray(m_tff[0])).max() > 1e-3
  for a, b in zip(m_ours, m_tff):
    np.testing.assert_allclose(a, (1 - beta) * np.asarray(b), rtol=0, atol=1e-6)
  m1 = out1.metrics['client_work']['train']
  m2 = out2.metrics['client_work']['train']
  assert m1['num_examples'] == m2['num_examples']
  np.testing.assert_allclose(m1['loss'], m2['loss'], rtol=1e-5)


def test_mimexlite_tracks_one_minibatch_gradient(task, client_data):
  """After one round, m_1 = (1 - beta) * sum_i n_i g_i / sum_i n_i, with g_i the
  gradient at x_0 of client i's FIRST minibatch (numpy recomputation)."""
  beta = 0.5
  alg = mime.build_mime(task.model_fn, mime.MimeConfig(optimizer=gbo_optimizers.SGDm(beta),
      client_learning_rate=0.1, local_steps=2, gradient=mime.ONE_BATCH))
  assert alg.name == 'mimexlite' and alg.compute.extra_gradient == 'one_batch'
  state = alg.process.initialize()
  x0 = trainable(alg.process, state)
  model = task.model_fn()
  total, weight = None, 0.0
  for dataset in client_data:
    for var, w in zip(model.trainable_variables, x0):
      var.assign(w)
    batch = next(iter(dataset))
    with tf.GradientTape() as tape:
      loss = model.forward_pass(batch, training=True).loss
    g = [x.numpy() for x in tape.gradient(loss, model.trainable_variables)]
    n = float(sum(int(b['y'].shape[0]) for b in dataset))
    total = [n * x for x in g] if total is None else [t + n * x for t, x in zip(total, g)]
    weight += n
  expected = [(1 - beta) * t / weight for t in total]
  state = alg.process.next(state, client_data).state
  got = state.client_work['statistics']['m']
  assert np.abs(expected[0]).max() > 1e-4
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
