"""Paper 000 §3 / Figure 1: FedAvg on the 1-D quadratic toy, through TFF.

Runs, all with M = 10 clients per round, B = 1, gamma_0 = 0.1, x_1 = 0.4,
server SGD with eta (paper: 0.001), averaged over --seeds repetitions. All runs
and seeds are the lanes and coordinates of ONE stacked model
(`quadratic.LaneQuadraticModel`) in one FedAvg: gamma_t per run from the round
number, K_t per run carried by the clients' batches, --rounds_per_call rounds
per TFF call; each lane follows its run's separate FedAvg exactly:

  const_k3 / const_k10 / const_k33   constant K, constant gamma      (Fig. 1a)
  decay_gamma                        K = 10, gamma_t = 0.1 * 0.995^t   (Fig. 1a)
  decay_k_0.99 / decay_k / decay_k_0.9995
                                     K_t = ceil(10 d_K^t), d_K = .99/.995/.9995 (Fig. 1b)

Prints a table (final x, distance to x* and to the constant-K surrogate
x*(gamma, K), total client steps) and, as its LAST line, one JSON object with
keys x_star, surrogate_minimiser, final_x, client_steps. Writes figure1.png and
curves.csv (the mean model over seeds after every round, per run).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os

from absl import flags
import numpy as np

from experiments import common
from experiments import report
from experiments import runtime_flags

flags.adopt_module_key_flags(runtime_flags)  # --help lists them

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

flags.DEFINE_integer('rounds', 3000, 'Rounds per run (paper: 3000).')
flags.DEFINE_integer('seeds', 10, 'Independent repetitions averaged (paper: 10).')
flags.DEFINE_list('runs', list(RUNS), f'Runs to do, from {list(RUNS)}.')
flags.DEFINE_float('server_learning_rate', 0.001, 'eta (paper: 0.001).')
flags.DEFINE_float('client_learning_rate', 0.1, 'gamma_0 (paper: 0.1).')
flags.DEFINE_integer('clients_per_round', 10, 'M (paper: 10).')
flags.DEFINE_integer('num_clients', 10_000, 'Size of the sampled client population.')
flags.DEFINE_integer('average_last', 1, 'final_x averages the mean model over this '
                     'many final rounds (1: the final model).')
flags.DEFINE_integer('seed', 0, 'Seed of the population and of sampling.')
flags.DEFINE_string('output_dir', 'runs/quadratic_toy', 'Where runs, table and figure go.')
flags.DEFINE_bool('progress', True, 'Show progress bars.')
flags.DEFINE_integer('rounds_per_call', 10, 'Rounds run by one call of the TFF computation.')
FLAGS = flags.FLAGS


def validate():
  runtime_flags.check()
  unknown = [r for r in FLAGS.runs if r not in RUNS]
  if unknown:
    raise ValueError(f'unknown runs {unknown}; choose from {list(RUNS)}')
  for name in ('rounds', 'seeds', 'clients_per_round', 'average_last', 'num_clients',
               'rounds_per_call'):
    if getattr(FLAGS, name) < 1:
      raise ValueError(f'--{name} must be >= 1')
  if FLAGS.clients_per_round > FLAGS.num_clients:
    raise ValueError('--clients_per_round cannot exceed --num_clients')
  if FLAGS.average_last > FLAGS.rounds:
    raise ValueError('--average_last cannot exceed --rounds')
  if FLAGS.server_learning_rate <= 0 or FLAGS.client_learning_rate <= 0:
    raise ValueError('learning rates must be > 0')


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
  from tff_algos import fedopt
  from tff_algos.core import client_work, optimizers, schedules
  import tensorflow_federated as tff
  rates = LaneLearningRates(tuple(schedules.ExponentialDecay(
      gamma, RUNS[n].get('client_lr_decay', 1.0)) for n in names))
  schedule = client_work.ClientSchedule(learning_rate=rates, local_steps=None, epochs=1)
  work = client_work.build_client_work(
      lambda: quadratic.LaneQuadraticModel(len(names), num_runs),
      optimizers.OptimizerSpec('sgd', gamma).build(), schedule,
      client_weighting=tff.learning.ClientWeighting.UNIFORM)
  return fedopt.compose('fedavg_lanes', lambda: quadratic.LaneQuadraticModel(
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
  drawn as the trainer draws them (`training.sample_clients`) from the
  population of `quadratic.population`; returns the global model after every
  round, [rounds, lanes, seeds]."""
  from tasks import quadratic
  from tff_algos import training
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
    data = [(list(z[training.sample_clients(ids, clients_per_round, seed, t)]),
             lane_steps(names, t).astype(np.int32)) for t in range(start, start + n)]
    state, out = computations[n](state, data)
    xs[start:start + n] = np.stack([np.asarray(x) for x in out])
    if bar is not None:
      bar.update(n)
  if bar is not None:
    bar.close()
  return xs


def main(argv):
  del argv
  common.quiet_logs()
  try:
    validate()
  except ValueError as e:
    return common.fail(e)
  from tasks import quadratic
  from tff_algos.core import schedules

  gamma = FLAGS.client_learning_rate
  x_star = quadratic.true_minimiser()
  surrogate = {k: quadratic.surrogate_minimiser(gamma, k) for k in (3, 10, 33)}
  with runtime_flags.managed_context():
    xs = run_lanes(FLAGS.runs, FLAGS.rounds, FLAGS.seeds, num_clients=FLAGS.num_clients,
                   clients_per_round=FLAGS.clients_per_round, seed=FLAGS.seed,
                   gamma=gamma, eta=FLAGS.server_learning_rate,
                   rounds_per_call=FLAGS.rounds_per_call, progress=FLAGS.progress)
  curves = {name: np.array([float(x.mean()) for x in xs[:, lane]])
            for lane, name in enumerate(FLAGS.runs)}
  final_x = {name: float(c[-FLAGS.average_last:].mean()) for name, c in curves.items()}
  client_steps = {name: schedules.LocalSteps(
      RUNS[name]['local_steps'], RUNS[name].get('local_steps_decay', 1.0)).total(FLAGS.rounds)
                  for name in FLAGS.runs}
  write_curves(curves)

  table = []
  for name in FLAGS.runs:
    k = RUNS[name]['local_steps']
    target = surrogate.get(k) if name.startswith('const') else x_star
    table.append([name, final_x[name], final_x[name] - x_star,
                  final_x[name] - target, client_steps[name]])
  print(report.format_table(
      ['run', 'final_x', 'minus_x*', 'minus_own_limit', 'client_steps/slot'], table))
  print(f'x* = {x_star:.5f}; surrogate x*(gamma={gamma:g}, K): '
        + ', '.join(f'K={k}: {v:.5f}' for k, v in surrogate.items())
        + '; own limit: surrogate for constant K, x* for the decaying runs')
  figure = plot(curves, x_star, surrogate)
  print(f'figure: {figure}')
  print(json.dumps(dict(
      x_star=x_star, surrogate_minimiser={str(k): v for k, v in surrogate.items()},
      final_x=final_x, client_steps=client_steps, rounds=FLAGS.rounds,
      seeds=FLAGS.seeds, server_learning_rate=FLAGS.server_learning_rate)))
  return 0


def write_curves(curves) -> str:
  """The mean model over seeds after every round, one column per run."""
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  path = os.path.join(FLAGS.output_dir, 'curves.csv')
  names = list(curves)
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round'] + names)
    for t in range(len(curves[names[0]])):
      writer.writerow([t + 1] + [repr(float(curves[n][t])) for n in names])
  return path


def plot(curves, x_star, surrogate) -> str:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, names, title in ((axes[0], FIG_1A, '(a) constant K vs decaying gamma'),
                           (axes[1], FIG_1B, '(b) decaying K (K_0 = 10)')):
    for name in names:
      if name in curves:
        ax.plot(np.arange(1, len(curves[name]) + 1), curves[name], label=name)
    ax.axhline(x_star, color='k', ls='--', lw=1, label='x*')
    if ax is axes[0]:
      for k, v in surrogate.items():
        ax.axhline(v, color='gray', ls=':', lw=1)
    ax.set_title(title); ax.set_xlabel('round'); ax.legend(fontsize=8)
  axes[0].set_ylabel('x (mean over seeds)')
  fig.tight_layout()
  path = os.path.join(FLAGS.output_dir, 'figure1.png')
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


if __name__ == '__main__':
  common.run(main)
