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
import json
import os

from absl import flags
import numpy as np

from experiments import report
from experiments.lib import common
from experiments.lib import runtime_flags

flags.adopt_module_key_flags(runtime_flags)  # --help lists them

from experiments.lib.quadratic_lanes import (  # pylint: disable=unused-import
    FIG_1A, FIG_1B, RUNS, LaneLearningRates, build_lanes, lane_steps, multi_round,
    run_lanes)

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


def main(argv):
  del argv
  common.quiet_logs()
  try:
    validate()
  except ValueError as e:
    return common.fail(e)
  common.writable_dir(FLAGS.output_dir, 'output_dir')
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
