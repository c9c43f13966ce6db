"""FedSplit: the recursion against NumPy (local SGD and the exact prox), its
fixed point the minimiser of sum_i f_i, client states kept and resumed, and
the flags it refuses."""

import numpy as np
import pytest

from least_squares import Problem, model, run_stateful
from tasks import TaskOptions, get_task
from tff_algos import training
from tff_algos.algorithms import fedsplit
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams
from tff_algos.training import client_state, sampling

X0 = np.array([0.5, -1.0, 2.0])


def local_prox(p, k, v, s, gamma, steps, clip=None, weight_decay=0.0):
  """K full-batch GD steps from v on f_k(w) + ||w - v||^2 / (2s)."""
  w = v.copy()
  for _ in range(steps):
    g = p.grad(k, w) + (w - v) / s
    norm = np.linalg.norm(g)
    if clip is not None and norm > clip:
      g = g * clip / norm
    w = w - gamma * (g + weight_decay * w)
  return w


def exact_prox(p, k, v, s):
  """prox_{s f_k}(v) = (s H_k + I)^-1 (s c_k + v) for f_k(w) = 1/2 w'H_k w - c_k'w."""
  return np.linalg.solve(s * p.H[k] + np.eye(p.dim), s * p.C[k] + v)


def reference(p, cohorts, s, prox, average='active'):
  """The recursion in float64: z_k^0 = x_0; v = 2x - z_k, z_half = prox(k, v),
  z_k += 2 (z_half - x); x = the mean of the cohort's z_k or of all m."""
  x = np.array(X0, np.float64)
  z = {k: x.copy() for k in range(p.num_clients)}
  for cohort in cohorts:
    new = {k: z[k] + 2 * (prox(k, 2 * x - z[k]) - x) for k in cohort}
    z.update(new)
    x = (np.mean([new[k] for k in cohort], axis=0) if average == 'active'
         else np.mean(list(z.values()), axis=0))
  return x, z


def run(p, cohorts, **config):
  algorithm = fedsplit.build_fedsplit(p.model_fn, fedsplit.FedSplitConfig(**config))
  state, states = run_stateful(algorithm.process, p, cohorts, X0)
  return model(algorithm.process, state), {k: np.asarray(v[0]) for k, v in states.items()}


@pytest.mark.parametrize('average,options', [
    ('active', dict()), ('all', dict()),
    ('active', dict(clip=1.0, weight_decay=0.01)),
])
def test_the_round_is_the_recursion_with_local_sgd_as_the_prox(average, options):
  """Partial participation: client 3 never joins and client 0 sits out round 2
  (their z_k stay); the local solve is K = 3 GD steps, as in NumPy."""
  p = Problem(seed=3)
  cohorts, s, gamma, steps = [[0, 1], [2, 1], [1, 0, 2]], 0.5, 0.1, 3
  x, z = run(p, cohorts, step_size=s, client_learning_rate=gamma, local_steps=steps,
             server_average=average, clip_norm=options.get('clip'),
             client_weight_decay=options.get('weight_decay', 0.0))
  expected_x, expected_z = reference(
      p, cohorts, s, lambda k, v: local_prox(p, k, v, s, gamma, steps, **options), average)
  print(f'{average} {options}: |x - NumPy| = {np.abs(x - expected_x).max():.1e}')
  np.testing.assert_allclose(x, expected_x, rtol=1e-5, atol=1e-5)
  for k in range(4):
    np.testing.assert_allclose(z[k], expected_z[k], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(z[3], X0.astype(np.float32))       # z_3^0 = x_0, kept
  if options:  # clipping bound: the clipped solve differs from the plain one
    plain, _ = reference(p, cohorts, s, lambda k, v: local_prox(p, k, v, s, gamma, steps),
                         average)
    assert np.abs(plain - expected_x).max() > 1e-3


def test_the_active_and_all_averages_differ_only_under_partial_participation():
  p = Problem(seed=3)
  config = dict(step_size=0.5, client_learning_rate=0.1, local_steps=3)
  full = [[0, 1, 2, 3]] * 2
  np.testing.assert_allclose(run(p, full, server_average='active', **config)[0],
                             run(p, full, server_average='all', **config)[0],
                             rtol=1e-6, atol=1e-6)
  partial = [[0, 1], [2, 1]]
  assert np.abs(run(p, partial, server_average='active', **config)[0]
                - run(p, partial, server_average='all', **config)[0]).max() > 1e-2


S, GAMMA, EXACT_STEPS = 0.5, 0.1, 100   # GD on the prox problem contracts by <= 0.79 a step


def test_with_a_converged_local_solve_it_is_the_exact_prox_recursion():
  """Full participation, 100 local GD steps (the local solve to ~1e-10): the
  rounds follow FedSplit with the exact prox, linear algebra in NumPy."""
  p = Problem()
  cohorts = [list(range(4))] * 3
  x, z = run(p, cohorts, step_size=S, client_learning_rate=GAMMA, local_steps=EXACT_STEPS)
  expected_x, expected_z = reference(p, cohorts, S, lambda k, v: exact_prox(p, k, v, S))
  print(f'FedSplit vs exact-prox NumPy after 3 rounds: {np.abs(x - expected_x).max():.1e}')
  np.testing.assert_allclose(x, expected_x, rtol=1e-5, atol=1e-5)
  for k in range(4):
    np.testing.assert_allclose(z[k], expected_z[k], rtol=1e-5, atol=1e-5)


def test_its_fixed_point_is_the_minimiser_of_the_sum_of_the_client_losses():
  """Pathak & Wainwright's correctness: with exact prox, x_t -> argmin sum_i f_i
  (where FedAvg's local steps stall short of it, test_feddyn)."""
  p = Problem()
  exact, _ = reference(p, [list(range(4))] * 20, S, lambda k, v: exact_prox(p, k, v, S))
  x, z = run(p, [list(range(4))] * 20, step_size=S, client_learning_rate=GAMMA,
             local_steps=EXACT_STEPS)
  error = np.abs(x - p.optimum).max()
  print(f'FedSplit after 20 rounds: |x - x*| = {error:.1e} (exact prox in float64: '
        f'{np.abs(exact - p.optimum).max():.1e}); |x_0 - x*| = '
        f'{np.abs(X0 - p.optimum).max():.1f}')
  assert np.abs(exact - p.optimum).max() < 1e-6
  assert error < 1e-4
  # The fixed point's client states: z_k = x* - s grad f_k(x*), whose mean is x*.
  for k in range(4):
    np.testing.assert_allclose(z[k], p.optimum - S * p.grad(k, p.optimum), atol=1e-4)


def test_traffic_is_one_model_each_way_and_excludes_the_client_state():
  p = Problem(dim=50)
  for average in ('active', 'all'):
    traffic = fedsplit.build_fedsplit(p.model_fn, fedsplit.FedSplitConfig(
        local_steps=1, server_average=average)).traffic
    assert traffic.model_bytes == 200
    assert 200 <= traffic.download_bytes < 200 + 32
    assert 200 <= traffic.upload_bytes < 200 + 32


@pytest.mark.parametrize('flags,message', [
    (dict(client_optimizer='adam'), 'fedsplit does not use --client_optimizer'),
    (dict(server_learning_rate=0.5), 'fedsplit does not use --server_learning_rate'),
    (dict(uniform_weighting=True), 'fedsplit does not use --uniform_weighting'),
    (dict(report_device_average=True), 'fedsplit does not use --report_device_average'),
    (dict(prox_mu=0.1), '--prox_mu is not used by fedsplit'),
    (dict(feddyn_alpha=0.1), '--feddyn_alpha is not used by fedsplit'),
    (dict(fedsplit_step_size=0.0), '--fedsplit_step_size must be > 0'),
    (dict(fedsplit_server_average='cohort'), '--fedsplit_server_average'),
])
def test_the_flags_it_does_not_read_are_refused(flags, message):
  algorithm_flags.check('fedsplit', HParams(fedsplit_step_size=0.1, local_steps=5,
                                            fedsplit_server_average='all', clip_norm=10.0))
  with pytest.raises(ValueError, match=message):
    algorithm_flags.check('fedsplit', HParams(**flags))


# -- client states through the trainer: kept on disk, resumed exactly ----------
def test_client_states_persist_and_resume_exactly(tmp_path):
  """6 rounds in one run equal 3, stopped, and 3 more resumed: the model and
  every client's stored z_k. A sampled client's z_k moved; a never-sampled
  one's row was never written, and reads as z^0 = x_0, the initial model."""
  from tff_algos.training import loop
  task = get_task('digits', TaskOptions(batch_size=16, num_clients=10, model='logistic'))
  algorithm = algorithm_flags.build('fedsplit', task.model_fn, HParams(
      local_steps=3, client_learning_rate=0.1, fedsplit_step_size=1.0))

  def config(out, rounds):
    return training.RunConfig(total_rounds=rounds, clients_per_round=5, seed=0,
                              rounds_per_eval=0, rounds_per_checkpoint=3,
                              output_dir=str(tmp_path / out), progress=False)

  def rows(out, x_0):
    store = client_state.ClientStateStore(str(tmp_path / out / 'client_state'),
                                          task.client_ids, x_0)
    try:
      return (dict(zip(task.client_ids, store.gather(task.client_ids))),
              dict(zip(task.client_ids, store.initialized)))
    finally:
      store.close()

  full = training.run_training(algorithm, task, config('full', 6))
  training.run_training(algorithm, task, config('stopped', 3))
  resumed = training.run_training(algorithm, task, config('stopped', 6))
  assert resumed.resumed_from == 3
  for a, b in zip(resumed.model_weights.trainable, full.model_weights.trainable):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
  state_0, initial = loop._initial_state(algorithm, task, config('x', 1), None)
  x_0 = [np.asarray(w) for w in algorithm.process.server_model(state_0).trainable]
  for a, b in zip(initial, x_0):
    np.testing.assert_array_equal(a, b)                 # z^0 = x_0
  (full_rows, written), (resumed_rows, _) = rows('full', x_0), rows('stopped', x_0)
  for cid in task.client_ids:
    for a, b in zip(resumed_rows[cid], full_rows[cid]):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  ids = task.client_ids
  sampled = {c for r in range(6) for c in sampling.sample_clients(ids, 5, 0, r)}
  never = set(ids) - sampled
  assert never and all(not written[c] for c in never)
  assert all(written[c] and max(np.abs(a - b).max() for a, b in zip(full_rows[c], x_0)) > 1e-4
             for c in sampled)
