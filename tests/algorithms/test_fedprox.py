"""FedProx against the proximal rule (numpy) and TFF's build_weighted_fed_prox."""

import numpy as np
import pytest
import tensorflow_federated as tff

from least_squares import Problem
from tff_algos.algorithms import fedopt
from tff_algos.algorithms import fedprox
from tff_algos.core import optimizers
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

GAMMA, BATCH, SERVER_LR = 0.05, 3, 0.8
X0 = np.array([0.3, -0.2, 1.0])


@pytest.fixture(scope='module')
def problem():
  return Problem(sizes=[5, 9, 6, 8], seed=5)


def run(process, p, rounds):
  state = process.set_model_weights(process.initialize(), p.weights(X0))
  for _ in range(rounds):
    state = process.next(state, p.datasets(batch_size=BATCH)).state
  return np.asarray(process.get_model_weights(state).trainable[0], np.float64)


def reference_fedprox(p, rounds, mu, weight_decay=0.0, clip=None, clipped=None):
  """One epoch of SGD on L_k + mu/2 ||theta - x||^2; n_k-weighted mean delta.

  With paper 003's reference-code regularisation (PyTorch: clip_grad_norm_ on
  the objective's gradient, then SGD's weight decay).
  """
  x = np.array(X0, np.float64)
  sizes = np.array([len(y) for y in p.Y], np.float64)
  for _ in range(rounds):
    deltas = []
    for k in range(p.num_clients):
      y, n = x.copy(), len(p.Y[k])
      for start in range(0, n, BATCH):
        g = p.batch_grad(k, y, start, min(start + BATCH, n)) + mu * (y - x)
        if clip is not None and np.linalg.norm(g) > clip:
          g = g * clip / np.linalg.norm(g)
          if clipped is not None:
            clipped.append(True)
        y = y - GAMMA * (g + weight_decay * y)
      deltas.append(x - y)
    x = x - SERVER_LR * np.average(deltas, axis=0, weights=sizes)
  return x


def tff_fed_prox(p, mu):
  return tff.learning.algorithms.build_weighted_fed_prox(
      p.model_fn, proximal_strength=mu,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(GAMMA),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(SERVER_LR))


def ours(p, mu):
  return algorithm_flags.build('fedprox', p.model_fn, HParams(
      prox_mu=mu, client_learning_rate=GAMMA, server_learning_rate=SERVER_LR)).process


@pytest.mark.parametrize('mu', [0.5, 2.0])
def test_fedprox_follows_the_proximal_rule(problem, mu):
  result = run(ours(problem, mu), problem, 2)
  np.testing.assert_allclose(result, reference_fedprox(problem, 2, mu), rtol=1e-5,
                             atol=1e-5)
  # The proximal term matters: mu = 0 (FedAvg) ends elsewhere.
  assert np.abs(result - reference_fedprox(problem, 2, 0.0)).max() > 1e-2


def test_compiled_local_loops_in_tff_rounds_follow_the_proximal_rule(problem):
  """`--compile_local_loop` end to end: FedProx built inside `compiled_loops`
  has XLA-compiled client loops in its round (the jit marker in the
  computation) and, run by the in-process backend for two rounds over clients
  of four sizes (four shapes to compile), follows the same rule as the loop."""
  from tff_algos.core import local_training
  with local_training.compiled_loops(True):
    process = ours(problem, 0.5)
  proto = process.next.to_building_block().proto.SerializeToString()
  assert b'_XlaMustCompile' in proto
  assert b'_XlaMustCompile' not in ours(problem, 0.5).next.to_building_block(
  ).proto.SerializeToString()
  np.testing.assert_allclose(run(process, problem, 2), reference_fedprox(problem, 2, 0.5),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('algorithm,mu', [('fedprox', 0.5), ('fedavg', 0.0)])
def test_weight_decay_and_clipping_follow_paper_003s_reference_code(problem, algorithm, mu):
  hp = HParams(client_learning_rate=GAMMA, server_learning_rate=SERVER_LR,
               client_weight_decay=0.1, clip_norm=0.5,
               **({'prox_mu': mu} if algorithm == 'fedprox' else {}))
  result = run(algorithm_flags.build(algorithm, problem.model_fn, hp).process, problem, 2)
  clipped = []
  expected = reference_fedprox(problem, 2, mu, weight_decay=0.1, clip=0.5, clipped=clipped)
  assert clipped  # the clipping branch was exercised
  np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
  # Both terms matter.
  assert np.abs(result - reference_fedprox(problem, 2, mu, clip=0.5)).max() > 1e-3
  assert np.abs(result - reference_fedprox(problem, 2, mu, weight_decay=0.1)).max() > 1e-3


def test_fedprox_equals_tff_at_mu_0_and_tff_has_the_opposite_sign(problem):
  np.testing.assert_allclose(run(ours(problem, 0.0), problem, 2),
                             run(tff_fed_prox(problem, 0.0), problem, 2),
                             rtol=0, atol=1e-5)
  # TFF 0.87's FedProx adds mu (x_t - theta): it follows the rule with -mu.
  theirs = run(tff_fed_prox(problem, 2.0), problem, 2)
  np.testing.assert_allclose(theirs, reference_fedprox(problem, 2, -2.0), rtol=1e-5,
                             atol=1e-5)
  assert np.abs(theirs - reference_fedprox(problem, 2, 2.0)).max() > 1e-2


def test_fedprox_mu_0_is_fedavg_and_traffic_is_fedavgs():
  p = Problem(seed=1)
  config = dict(client_learning_rate=0.05, local_steps=4)
  prox = fedprox.build_fedprox(p.model_fn, fedprox.FedProxConfig(mu=0.0, **config))
  avg = fedopt.build_fedopt(p.model_fn, fedopt.FedOptConfig(**config))
  assert prox.traffic == avg.traffic
  # Paper 004 eq. (22): FedProx costs 5 operations per parameter and step, SGD 2.
  assert (prox.compute.optimizer_flops_per_param, avg.compute.optimizer_flops_per_param) == (5, 2)
  np.testing.assert_allclose(run(prox.process, p, 2), run(avg.process, p, 2), rtol=0,
                             atol=1e-6)


def test_fedprox_flags_validate_early():
  algorithm_flags.check('fedprox', HParams(prox_mu=0.1, server_optimizer='adam',
                                    server_learning_rate=0.01, local_steps=5))
  for bad in (HParams(prox_mu=-1.0), HParams(client_epochs_per_round=0),
              HParams(local_steps_decay=0.9)):
    with pytest.raises(ValueError):
      algorithm_flags.check('fedprox', bad)
