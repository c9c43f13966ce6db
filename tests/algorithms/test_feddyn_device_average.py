"""--report_device_average: paper 003's evaluated model (the average of all
device models) for FedDyn, SCAFFOLD, FedAvg and FedProx, and its upload."""

import numpy as np
import pytest

from least_squares import Problem, model, run_stateful
from tff_algos.algorithms import fedprox
from tff_algos.core.stateful_process import Population
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams

METHODS = ('feddyn', 'scaffold', 'fedavg', 'fedprox')


def reference_fedprox(p, cohorts, x0, gamma, mu, steps, uniform):
  """FedProx (FedAvg: mu = 0), full-batch local GD, server lr 1, in float64;
  returns the server model and every device's last model."""
  x = np.array(x0, np.float64)
  devices = {k: x.copy() for k in range(p.num_clients)}
  for cohort in cohorts:
    models, weights = [], []
    for k in cohort:
      y = x.copy()
      for _ in range(steps):
        y = y - gamma * (p.grad(k, y) + mu * (y - x))
      devices[k] = y
      models.append(y)
      weights.append(1.0 if uniform else len(p.Y[k]))
    x = np.average(models, axis=0, weights=weights)
  return x, devices


@pytest.mark.parametrize('mu,uniform', [(0.0, False), (0.5, False), (0.5, True)])
def test_fedprox_reports_the_average_of_all_device_models(mu, uniform):
  # Unequal sizes; client 3 never participates (it holds the initial model).
  p = Problem(sizes=[4, 6, 8, 10], seed=5)
  cohorts = [[0, 1], [2, 1], [0, 2]]
  x0 = np.array([0.5, -1.0, 2.0])
  gamma, steps = 0.05, 3
  name = 'fedprox' if mu else 'fedavg'
  prox = dict(prox_mu=mu) if mu else {}   # --prox_mu is fedprox's flag only
  hp = HParams(client_learning_rate=gamma, local_steps=steps, uniform_weighting=uniform,
               report_device_average=True, **prox)
  algorithm = algorithm_flags.build(name, p.model_fn, hp)
  assert algorithm.stateful_clients
  sizes = np.array([len(y) for y in p.Y], np.float64)
  state, _ = run_stateful(algorithm.process, p, cohorts, x0,
                          Population(4, float(sizes.mean())))
  x, devices = reference_fedprox(p, cohorts, x0, gamma, mu, steps, uniform)
  weights = np.ones(4) if uniform else sizes
  average = np.average([devices[k] for k in range(4)], axis=0, weights=weights)
  server_model = np.asarray(algorithm.process.server_model(state).trainable[0])
  np.testing.assert_allclose(server_model, x, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(model(algorithm.process, state), average, rtol=1e-5, atol=1e-5)
  assert np.abs(average - x).max() > 1e-2


@pytest.mark.parametrize('name', METHODS)
def test_the_device_average_costs_one_more_model_upload(name):
  p = Problem(dim=50)   # a model of 200 bytes
  hp = HParams(local_steps=1)
  plain = algorithm_flags.build(name, p.model_fn, hp).traffic
  with_average = algorithm_flags.build(
      name, p.model_fn, HParams(local_steps=1, report_device_average=True)).traffic
  assert with_average.model_bytes == plain.model_bytes == 200
  # The same model down (a stateful round also broadcasts the mean client size).
  assert 0 <= with_average.download_bytes - plain.download_bytes <= 8
  # One model more, plus at most the weight scalar FedAvg/FedProx send.
  assert 200 <= with_average.upload_bytes - plain.upload_bytes <= 200 + 8


def test_the_option_is_refused_where_it_does_not_apply():
  for name in ('fedgbo', 'nastya', 'fedmax'):
    with pytest.raises(ValueError, match='report_device_average'):
      algorithm_flags.check(name, HParams(report_device_average=True))
  with pytest.raises(ValueError, match='server_optimizer=sgd'):
    algorithm_flags.check('fedavg', HParams(report_device_average=True, server_optimizer='adam'))
  with pytest.raises(ValueError, match='server_optimizer=sgd'):
    fedprox.FedProxConfig(report_device_average=True, server_lr_decay=0.99)


def test_fedavg_device_average_through_the_trainer_resumes_exactly(tmp_path):
  # The average lives in server state and each device's model in the client
  # store: a run stopped at round 2 and resumed to 4 ends at the same model.
  from tasks import TaskOptions, get_task
  from tff_algos import training
  task = get_task('digits', TaskOptions(batch_size=16, num_clients=10, model='logistic'))
  algorithm = algorithm_flags.build('fedavg', task.model_fn, HParams(
      local_steps=3, client_learning_rate=0.1, report_device_average=True))

  def run(out, rounds):
    return training.run_training(algorithm, task, training.RunConfig(
        total_rounds=rounds, clients_per_round=3, seed=0, rounds_per_eval=0,
        rounds_per_checkpoint=2, output_dir=str(tmp_path / out), progress=False))

  full = run('full', 4)
  run('stopped', 2)
  resumed = run('stopped', 4)
  assert resumed.resumed_from == 2
  for a, b in zip(resumed.model_weights.trainable, full.model_weights.trainable):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
  # 3 of 10 devices per round: the average of all devices is not the server model.
  server = algorithm.process.server_model(full.state)
  assert np.abs(np.asarray(server.trainable[0]) -
                np.asarray(full.model_weights.trainable[0])).max() > 1e-4
