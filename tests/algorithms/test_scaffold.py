"""SCAFFOLD (option II): convergence and exact update equations."""

import numpy as np
import pytest

from least_squares import Problem, model, run_stateful
from tff_algos.algorithms import scaffold
from tff_algos.core.stateful_process import Population
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams


def test_scaffold_reaches_the_optimum():
  # Same problem and local work as FedDyn's test (FedAvg stalls at ~0.49 there).
  p = Problem()
  algorithm = scaffold.build_scaffold(p.model_fn, scaffold.ScaffoldConfig(
      client_learning_rate=0.05, local_steps=30))
  state, _ = run_stateful(algorithm.process, p, [list(range(4))] * 50, np.zeros(3))
  error = np.abs(model(algorithm.process, state) - p.optimum).max()
  print(f'SCAFFOLD error after 50 rounds {error:.2e}')
  assert error < 1e-4


def reference_scaffold(p, cohorts, x0, gamma, eta_g, batch_size, epochs=1, devices=None,
                       lr_decay=1.0, reference=False):
  """Karimireddy et al. Algorithm 1, option II, in float64 numpy (`devices`:
  a dict filled with each client's last local model y_K); `reference`: paper
  003's code (c / w_i in the step, w_i-weighted dc, c_i+ over the initial lr)."""
  n_total = p.num_clients
  sizes = np.array([len(y) for y in p.Y], np.float64)
  x, c = np.array(x0, np.float64), np.zeros(p.dim)
  c_i = {k: np.zeros(p.dim) for k in range(n_total)}
  devices = {} if devices is None else devices
  for t, cohort in enumerate(cohorts):
    gamma_t = gamma * lr_decay ** t
    dys, dcs = [], []
    for k in cohort:
      w = sizes[k] / sizes.mean() if reference else 1.0
      y, steps, n = x.copy(), 0, len(p.Y[k])
      for _ in range(epochs):
        for start in range(0, n, batch_size):
          g = p.batch_grad(k, y, start, min(start + batch_size, n))
          y = y - gamma_t * (g - c_i[k] + c / w)
          steps += 1
      new = c_i[k] - c + (x - y) / (steps * (gamma if reference else gamma_t))
      dys.append(y - x)
      devices[k] = y
      dcs.append(w * (new - c_i[k]))
      c_i[k] = new
    x = x + eta_g * np.mean(dys, axis=0)
    c = c + np.sum(dcs, axis=0) / n_total
  return x, c, c_i


def test_scaffold_reference_conventions_follow_the_authors_code():
  # Unequal sizes and an lr decay: both of the code's conventions matter here.
  p = Problem(num_clients=5, sizes=[5, 7, 9, 6, 8], seed=4)
  cohorts = [[0, 1, 2], [1, 3], [0, 1]]
  x0 = np.array([1.0, 0.0, -0.5])
  gamma, batch, decay = 0.03, 4, 0.7
  sizes = [len(y) for y in p.Y]
  results = {}
  for reference in (False, True):
    algorithm = scaffold.build_scaffold(p.model_fn, scaffold.ScaffoldConfig(
        client_learning_rate=gamma, client_lr_decay=decay, client_epochs_per_round=1,
        reference_conventions=reference))
    state, states = run_stateful(algorithm.process, p, cohorts, x0,
                                 Population(5, float(np.mean(sizes))), batch_size=batch)
    x, c, c_i = reference_scaffold(p, cohorts, x0, gamma, 1.0, batch, lr_decay=decay,
                                   reference=reference)
    np.testing.assert_allclose(model(algorithm.process, state), x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state['algorithm']['c'][0]), c, rtol=1e-4,
                               atol=1e-5)
    for k in range(5):
      np.testing.assert_allclose(np.asarray(states[k][0]), c_i[k], rtol=1e-4, atol=1e-5)
    results[reference] = c
  assert np.abs(results[True] - results[False]).max() > 1e-2   # the conventions differ
  algorithm_flags.check('scaffold', HParams(scaffold_reference_conventions=True))
  with pytest.raises(ValueError, match='scaffold_reference_conventions'):
    algorithm_flags.check('feddyn', HParams(scaffold_reference_conventions=True))


@pytest.mark.parametrize('report', [False, True])
def test_scaffold_follows_the_update_equations(report):
  # Minibatches (one epoch, unequal sizes: K differs per client), partial
  # participation, global step eta_g != 1, N = 5 clients in all.
  p = Problem(num_clients=5, sizes=[5, 7, 9, 6, 8], seed=4)
  cohorts = [[0, 1, 2], [1, 3], [0, 1]]
  x0 = np.array([1.0, 0.0, -0.5])
  gamma, eta_g, batch = 0.03, 0.7, 4
  algorithm = scaffold.build_scaffold(p.model_fn, scaffold.ScaffoldConfig(
      client_learning_rate=gamma, server_learning_rate=eta_g, client_epochs_per_round=1,
      report_device_average=report))
  state, states = run_stateful(algorithm.process, p, cohorts, x0, batch_size=batch)
  devices = {k: x0 for k in range(5)}
  x, c, c_i = reference_scaffold(p, cohorts, x0, gamma, eta_g, batch, devices=devices)
  server_model = np.asarray(algorithm.process.server_model(state).trainable[0])
  np.testing.assert_allclose(server_model, x, rtol=1e-5, atol=1e-5)
  if report:  # the reported model: the plain mean of all 5 device models
    average = np.mean(list(devices.values()), axis=0)
    np.testing.assert_allclose(model(algorithm.process, state), average, rtol=1e-5,
                               atol=1e-5)
    assert np.abs(average - x).max() > 1e-2
    state = dict(state, algorithm=state['algorithm']['algorithm'])
    states = {k: s['algorithm'] for k, s in states.items()}
  else:
    np.testing.assert_allclose(model(algorithm.process, state), x, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(state['algorithm']['c'][0]), c, rtol=1e-5,
                             atol=1e-6)
  for k in range(5):
    np.testing.assert_allclose(np.asarray(states[k][0]), c_i[k], rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(states[4][0]) == 0)       # never selected
  assert np.abs(c).max() > 1e-2 and np.abs(c_i[3]).max() > 1e-2


def test_local_step_adds_c_minus_c_i_formed_once():
  """The step's correction in paper 003's code's order: c - c_i formed once
  per client, then g + (c - c_i) at each step (the paper's g - c_i + c rounds
  differently for some values; docs/papers/paper003.md)."""
  import tensorflow as tf
  rng = np.random.default_rng(0)
  g, c_i, c = (rng.normal(size=1000).astype(np.float32) for _ in range(3))
  fixed = scaffold.drift([tf.constant(c_i)], [tf.constant(c)])
  np.testing.assert_array_equal(fixed[0], c - c_i)
  got = scaffold.corrected_gradient(scaffold.ScaffoldConfig(), [tf.constant(g)],
                                    [tf.zeros(1000)], fixed)
  np.testing.assert_array_equal(got[0], g + (c - c_i))
  assert np.any(g + (c - c_i) != (g - c_i) + c)


def test_scaffold_traffic_is_two_models_each_way():
  p = Problem(dim=50)
  traffic = scaffold.build_scaffold(p.model_fn, scaffold.ScaffoldConfig(
      local_steps=1)).traffic
  assert traffic.model_bytes == 200
  assert 400 <= traffic.download_bytes < 400 + 32     # x, c + hparams
  assert 400 <= traffic.upload_bytes < 400 + 32       # dy, dc + stats, metrics
  # Reporting the average of all device models costs one more upload.
  traffic = scaffold.build_scaffold(p.model_fn, scaffold.ScaffoldConfig(
      local_steps=1, report_device_average=True)).traffic
  assert 400 <= traffic.download_bytes < 400 + 32
  assert 600 <= traffic.upload_bytes < 600 + 32


def test_scaffold_flags_validate_early():
  spec = algorithm_flags.check('scaffold', HParams(server_learning_rate=0.5, local_steps=5))
  assert spec.name == 'scaffold'
  for bad in (HParams(client_learning_rate=0.0), HParams(server_learning_rate=0.0),
              HParams(client_optimizer='sgdm', client_momentum=0.9),
              HParams(server_optimizer='adam')):
    with pytest.raises(ValueError):
      algorithm_flags.check('scaffold', bad)
