"""FedNova: FedAvg when every client takes the same number of steps, the
normalised rule (NumPy) when they do not, and the flags it refuses."""

import numpy as np
import pytest

from least_squares import Problem
from processes import run_rounds, trainable
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

GAMMA, SERVER_LR = 0.05, 0.7
X0 = np.array([0.3, -0.2, 1.0])


@pytest.fixture(scope='module')
def problem():
  return Problem(sizes=[5, 9, 6, 8], seed=5)


def run(name, p, hp, batch_size, rounds=3):
  process = algorithm_flags.build(name, p.model_fn, hp).process
  state, outputs = run_rounds(process, p.weights(X0), p.datasets(batch_size=batch_size),
                              rounds)
  return trainable(process, state)[0], outputs


def reference(p, rounds, batch_size, normalized=True):
  """One epoch of SGD per client; FedNova's server step (or FedAvg's)."""
  x = np.array(X0, np.float64)
  weights = np.array([len(y) for y in p.Y], np.float64)
  weights /= weights.sum()                                      # p_i = n_i / n
  for _ in range(rounds):
    updates, steps = [], []
    for k in range(p.num_clients):
      y, n = x.copy(), len(p.Y[k])
      starts = range(0, n, batch_size)
      for start in starts:
        y = y - GAMMA * p.batch_grad(k, y, start, min(start + batch_size, n))
      updates.append((x - y) / len(starts) if normalized else x - y)   # d_i
      steps.append(len(starts))                                        # tau_i
    tau_eff = weights @ steps if normalized else 1.0
    x = x - SERVER_LR * tau_eff * (weights @ np.array(updates))
  return x


def test_equal_steps_is_fedavg_to_the_last_bit(problem):
  # Batch 1, K = 4: every client (5 to 9 examples) takes tau_i = 4 steps; a
  # power of two, so d_i = delta_i / 4 and tau_eff = 4 are exact in float32.
  hp = HParams(local_steps=4, client_learning_rate=GAMMA, server_learning_rate=SERVER_LR)
  nova, outputs = run('fednova', problem, hp, batch_size=1)
  avg, _ = run('fedavg', problem, hp, batch_size=1)
  assert all(int(out.metrics['client_work']['client_steps']) == 4 * problem.num_clients
             for out in outputs)
  assert np.abs(nova - X0).max() > 1e-2      # it trained
  np.testing.assert_array_equal(nova, avg)


def test_unequal_steps_follow_the_normalised_rule(problem):
  # One epoch at batch 2: tau_i = ceil(n_i / 2) = 3, 5, 3, 4 steps.
  hp = HParams(client_epochs_per_round=1, client_learning_rate=GAMMA,
               server_learning_rate=SERVER_LR)
  nova, outputs = run('fednova', problem, hp, batch_size=2)
  assert [int(out.metrics['client_work']['client_steps']) for out in outputs] == [15] * 3
  np.testing.assert_allclose(nova, reference(problem, 3, 2), rtol=1e-5, atol=1e-6)
  fedavg = reference(problem, 3, 2, normalized=False)
  assert np.abs(nova - fedavg).max() > 1e-3  # the normalisation matters here
  avg, _ = run('fedavg', problem, hp, batch_size=2)
  np.testing.assert_allclose(avg, fedavg, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('flags,message', [
    ({'prox_mu': 0.1}, '--prox_mu is not used by fednova'),
    ({'clip_norm': 1.0}, '--clip_norm is not used by fednova'),
    ({'client_optimizer': 'adam'}, 'fednova does not use --client_optimizer'),
    ({'server_optimizer': 'adam'}, 'fednova does not use --server_optimizer'),
    ({'uniform_weighting': True}, 'fednova does not use --uniform_weighting'),
    ({'local_steps_decay': 0.9}, 'local_steps_decay needs local_steps'),
])
def test_the_registry_refuses_flags_fednova_does_not_read(flags, message):
  algorithm_flags.check('fednova', HParams(local_steps=4, server_learning_rate=0.5,
                                    client_lr_decay=0.99))   # flags it reads
  with pytest.raises(ValueError, match=message):
    algorithm_flags.check('fednova', HParams(**flags))
