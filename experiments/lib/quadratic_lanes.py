"""The runs of paper 000's Figure 1 as lanes of one stacked TFF computation
(the library side of `experiments.quadratic_toy`, which adds flags, the table
and the figure; tests import this module, which defines no flags)."""

from __future__ import annotations

import dataclasses

import numpy as np

RUNS = {
    'const_k3': dict(local_steps=3),
    'const_k10': dict(local_steps=10),
    'const_k33': dict(local_steps=33),
    'decay_gamma': dict(local_steps=10, client_lr_decay=0.995),
    'decay_k_0.99': dict(local_steps=10, local_steps_decay=0.99),
    'decay_k': dict(local_steps=10, local_steps_decay=0.995),
    'decay_k_0.9995': dict(local_steps=10, local_steps_decay=0.9995),
}
FIG_1A = ('const_k3', 'const_k10', 'const_k33', 'decay_gamma')
FIG_1B = ('const_k10', 'decay_k_0.99', 'decay_k', 'decay_k_0.9995')


def lane_steps(names, round_num: int) -> np.ndarray:
  """K_t of each run (lane) in round t, from its `schedules.LocalSteps`."""
  from tff_algos.core import schedules
  return np.array([schedules.LocalSteps(RUNS[n]['local_steps'],
                                        RUNS[n].get('local_steps_decay', 1.0))(round_num)
                   for n in names])


@dataclasses.dataclass(frozen=True)
class LaneLearningRates:
  """gamma_t of every lane, [L, 1] (each lane's own `schedules.ExponentialDecay`),
  in the place of `ClientSchedule.learning_rate`."""
  rates: tuple

  def __call__(self, t):
    import tensorflow as tf
    if isinstance(t, (tf.Tensor, tf.Variable)):
      return tf.stack([r(t) for r in self.rates])[:, None]
    return np.array([r(t) for r in self.rates], np.float32)[:, None]


def build_lanes(names, gamma: float, eta: float, num_runs: int):
  """One FedAvg (FedOpt, server SGD at eta) over the stacked model whose lane l
  is run names[l]: gamma_t per lane from the round number in the state; K_t per
  lane carried by the clients' datasets (`quadratic.lane_client_dataset`),
  which the client loop runs through once."""
  from tasks import quadratic
  from tff_algos.core import client_work, optimizers, schedules
  from tff_algos.core.composition import compose
  import tensorflow_federated as tff
  rates = LaneLearningRates(tuple(schedules.ExponentialDecay(
      gamma, RUNS[n].get('client_lr_decay', 1.0)) for n in names))
  schedule = client_work.ClientSchedule(learning_rate=rates, local_steps=None, epochs=1)
  work = client_work.build_client_work(
      lambda: quadratic.LaneQuadraticModel(len(names), num_runs),
      optimizers.OptimizerSpec('sgd', gamma).build(), schedule,
      client_weighting=tff.learning.ClientWeighting.UNIFORM)
  return compose('fedavg_lanes', lambda: quadratic.LaneQuadraticModel(
      len(names), num_runs), work, optimizers.OptimizerSpec('sgd', eta).build())


def multi_round(process, rounds: int, num_runs: int, num_lanes: int):
  """`rounds` rounds of `process` as one TFF computation: (state, per round
  <the cohort's points z@CLIENTS, the lanes' K_t@SERVER>) -> (state, <global
  model x after each round>); the clients' datasets are built inside."""
  import tensorflow_federated as tff
  from tasks import quadratic
  state_type = process.next.type_signature.parameter[0]
  point, steps = tff.TensorType(np.float32, [num_runs]), tff.TensorType(np.int32, [num_lanes])
  client_data = tff.tensorflow.computation(quadratic.lane_client_dataset, point, steps)
  round_type = tff.StructType([tff.FederatedType(point, tff.CLIENTS),
                               tff.FederatedType(steps, tff.SERVER)])

  @tff.federated_computation(state_type, tff.StructType([round_type] * rounds))
  def run(state, data):
    xs = []
    for r in range(rounds):
      z, k = data[r]
      datasets = tff.federated_map(client_data, (z, tff.federated_broadcast(k)))
      state = process.next(state, datasets).state
      xs.append(tff.federated_map(process.get_model_weights, state).trainable[0])
    return state, tuple(xs)
  return run


def run_lanes(names, rounds: int, seeds: int, *, num_clients: int, clients_per_round: int,
              seed: int, gamma: float, eta: float, rounds_per_call: int = 10,
              progress: bool = False) -> np.ndarray:
  """The runs `names` (lanes) x `seeds` (runs) for `rounds` rounds, clients
  drawn as the trainer draws them (`sampling.sample_clients`) from the
  population of `quadratic.population`; returns the global model after every
  round, [rounds, lanes, seeds]."""
  from tasks import quadratic
  from tff_algos.training import sampling
  z = quadratic.population(seeds, num_clients, seed)
  ids = list(range(num_clients))
  process = build_lanes(names, gamma, eta, seeds).process
  state = process.initialize()  # x_1 = 0.4 in every coordinate: no randomness
  xs = np.empty((rounds, len(names), seeds), np.float32)
  computations = {}
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=rounds, unit='round', desc='all runs', dynamic_ncols=True)
  for start in range(0, rounds, rounds_per_call):
    n = min(rounds_per_call, rounds - start)
    if n not in computations:
      computations[n] = multi_round(process, n, seeds, len(names))
    data = [(list(z[sampling.sample_clients(ids, clients_per_round, seed, t)]),
             lane_steps(names, t).astype(np.int32)) for t in range(start, start + n)]
    state, out = computations[n](state, data)
    xs[start:start + n] = np.stack([np.asarray(x) for x in out])
    if bar is not None:
      bar.update(n)
  if bar is not None:
    bar.close()
  return xs
