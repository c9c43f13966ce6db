"""FedExP: the server step eta_g = max(1, sum_i ||Delta_i||^2 / (2M (||Delta||^2
+ eps))) against its closed form (NumPy), FedAvg when the clients agree, the
average of the last two iterates, and the flags it refuses."""

import numpy as np
import pytest

from least_squares import Problem
from processes import run_rounds, trainable
from tff_algos.algorithms import fedexp, fedopt
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

GAMMA, K, EPS = 0.1, 3, 1e-3
X0 = np.array([0.3, -0.2, 1.0])


@pytest.fixture(scope='module')
def problem():
  return Problem(seed=3, spread=0.8)


def reference(p: Problem, rounds: int, epsilon: float = EPS):
  """Algorithm 1 in float64: K full-batch GD steps per client, the mean
  update extrapolated by eta_g; (final x, each round's eta_g, each x_t)."""
  x, etas, iterates = np.array(X0, np.float64), [], [np.array(X0, np.float64)]
  for _ in range(rounds):
    deltas = []
    for k in range(p.num_clients):
      y = x.copy()
      for _ in range(K):
        y = y - GAMMA * p.grad(k, y)
      deltas.append(x - y)
    mean = np.mean(deltas, axis=0)
    eta = max(1.0, sum(d @ d for d in deltas) / (2 * len(deltas) * (mean @ mean + epsilon)))
    x = x - eta * mean
    etas.append(eta)
    iterates.append(x)
  return x, etas, iterates


def _run(p: Problem, rounds: int, **config):
  algorithm = fedexp.build_fedexp(p.model_fn, fedexp.FedExPConfig(
      **{'client_learning_rate': GAMMA, 'local_steps': K, 'epsilon': EPS, **config}))
  state, outputs = run_rounds(algorithm.process, p.weights(X0), p.datasets(), rounds)
  etas = [float(o.metrics['aggregator']['server_step_size']) for o in outputs]
  return algorithm, state, etas


def test_the_server_step_is_the_closed_form(problem):
  algorithm, state, etas = _run(problem, 4)
  x, expected_etas, _ = reference(problem, 4)
  assert max(expected_etas) > 1.2   # the clients disagree: it extrapolates
  np.testing.assert_allclose(etas, expected_etas, rtol=1e-4)
  np.testing.assert_allclose(trainable(algorithm.process, state)[0], x, rtol=1e-4, atol=1e-5)


def test_epsilon_bounds_the_step_as_the_mean_update_vanishes(problem):
  """With every update tiny, ||Delta||^2 << epsilon and eta_g falls back to 1."""
  x, expected_etas, _ = reference(problem, 2, epsilon=1e6)
  assert expected_etas == [1.0, 1.0]
  algorithm, state, etas = _run(problem, 2, epsilon=1e6)
  assert etas == [1.0, 1.0]
  np.testing.assert_allclose(trainable(algorithm.process, state)[0], x, rtol=1e-4, atol=1e-5)


def test_clients_that_agree_make_it_fedavg_to_the_last_bit():
  """Identical clients: ||Delta_i|| = ||Delta||, the ratio is 1/2, eta_g = 1,
  and the round is FedAvg with equal weights (server SGD at 1)."""
  p = Problem(num_clients=3, seed=4)
  p.X, p.Y = [p.X[0]] * 3, [p.Y[0]] * 3
  p.H, p.C = [p.H[0]] * 3, [p.C[0]] * 3
  algorithm, state, etas = _run(p, 3)
  assert etas == [1.0, 1.0, 1.0]
  avg = fedopt.build_fedopt(p.model_fn, fedopt.FedOptConfig(
      client_learning_rate=GAMMA, local_steps=K, uniform_weighting=True))
  avg_state, _ = run_rounds(avg.process, p.weights(X0), p.datasets(), 3)
  np.testing.assert_array_equal(trainable(algorithm.process, state)[0],
                                trainable(avg.process, avg_state)[0])


def test_the_evaluated_model_can_be_the_average_of_the_last_two_iterates(problem):
  algorithm, state, _ = _run(problem, 3, average_last_two=True)
  _, _, iterates = reference(problem, 3)
  np.testing.assert_allclose(trainable(algorithm.process, state)[0],
                             (iterates[-1] + iterates[-2]) / 2, rtol=1e-4, atol=1e-5)
  assert algorithm.traffic == _run(problem, 1)[0].traffic  # nothing more goes up or down


def test_the_upload_is_the_update_and_one_scalar(problem):
  algorithm = fedexp.build_fedexp(problem.model_fn)
  avg = fedopt.build_fedopt(problem.model_fn)
  assert algorithm.traffic.upload_bytes == avg.traffic.upload_bytes + 4  # ||Delta_i||^2


@pytest.mark.parametrize('flags,message', [
    (dict(client_optimizer='adam'), 'fedexp does not use --client_optimizer'),
    (dict(server_learning_rate=0.5), 'fedexp does not use --server_learning_rate'),
    (dict(uniform_weighting=True), 'fedexp does not use --uniform_weighting'),
    (dict(prox_mu=0.1), '--prox_mu is not used by fedexp'),
    (dict(fedexp_epsilon=0.0), '--fedexp_epsilon must be > 0'),
])
def test_the_flags_it_does_not_read_are_refused(flags, message):
  algorithm_flags.check('fedexp', HParams(fedexp_epsilon=1e-2, fedexp_average_last_two=True,
                                          local_steps=5))
  with pytest.raises(ValueError, match=message):
    algorithm_flags.check('fedexp', HParams(**flags))
