"""Paper 000 §3 / Figure 1: FedAvg on the 1-D quadratic toy, through TFF.

Runs, all with M = 10 clients per round, B = 1, gamma_0 = 0.1, x_1 = 0.4,
server SGD with eta (paper: 0.001), averaged over --seeds repetitions (the
seeds are the coordinates of one vectorised model, see tasks/quadratic.py):

  const_k3 / const_k10 / const_k33   constant K, constant gamma      (Fig. 1a)
  decay_gamma                        K = 10, gamma_t = 0.1 * 0.995^t   (Fig. 1a)
  decay_k_0.99 / decay_k / decay_k_0.9995
                                     K_t = ceil(10 d_K^t), d_K = .99/.995/.9995 (Fig. 1b)

Prints a table (final x, distance to x* and to the constant-K surrogate
x*(gamma, K), total client steps) and, as its LAST line, one JSON object with
keys x_star, surrogate_minimiser, final_x, client_steps. Writes figure1.png.
"""

from __future__ import annotations

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
FLAGS = flags.FLAGS


def validate():
  runtime_flags.check()
  unknown = [r for r in FLAGS.runs if r not in RUNS]
  if unknown:
    raise ValueError(f'unknown runs {unknown}; choose from {list(RUNS)}')
  for name in ('rounds', 'seeds', 'clients_per_round', 'average_last', 'num_clients'):
    if getattr(FLAGS, name) < 1:
      raise ValueError(f'--{name} must be >= 1')
  if FLAGS.average_last > FLAGS.rounds:
    raise ValueError('--average_last cannot exceed --rounds')
  if FLAGS.server_learning_rate <= 0 or FLAGS.client_learning_rate <= 0:
    raise ValueError('learning rates must be > 0')


def run_name_dir(name: str) -> str:
  tag = (f'{name}_R{FLAGS.rounds}_S{FLAGS.seeds}_eta{FLAGS.server_learning_rate:g}'
         f'_g{FLAGS.client_learning_rate:g}_M{FLAGS.clients_per_round}_seed{FLAGS.seed}')
  return os.path.join(FLAGS.output_dir, tag)


def main(argv):
  del argv
  common.quiet_logs()
  try:
    validate()
  except ValueError as e:
    return common.fail(e)
  from tasks import quadratic
  from tff_algos import fedopt, training
  from tff_algos.core import optimizers, schedules

  gamma = FLAGS.client_learning_rate
  x_star = quadratic.true_minimiser()
  surrogate = {k: quadratic.surrogate_minimiser(gamma, k) for k in (3, 10, 33)}
  task = quadratic.build_quadratic(num_runs=FLAGS.seeds, num_clients=FLAGS.num_clients,
                                   seed=FLAGS.seed)
  final_x, client_steps, curves = {}, {}, {}

  def record(done, state, row):
    x = np.asarray(state.global_model_weights.trainable[0])
    row['x_mean'] = float(x.mean())
    row['x_std'] = float(x.std())

  with runtime_flags.managed_context():
    for name in FLAGS.runs:
      spec = RUNS[name]
      config = fedopt.FedOptConfig(
          client_optimizer=optimizers.OptimizerSpec('sgd', gamma),
          server_optimizer=optimizers.OptimizerSpec('sgd', FLAGS.server_learning_rate),
          uniform_weighting=True, **spec)
      algorithm = fedopt.build_fedopt(task.model_fn, config, name=name)
      out_dir = run_name_dir(name)
      training.run_training(
          algorithm, task,
          training.RunConfig(total_rounds=FLAGS.rounds,
                             clients_per_round=FLAGS.clients_per_round,
                             seed=FLAGS.seed, rounds_per_eval=0,
                             rounds_per_checkpoint=max(1, min(100, FLAGS.rounds)),
                             output_dir=out_dir, progress=FLAGS.progress),
          round_callback=record,
          initial_weights=_initial(task))
      rows = report.read_metrics(os.path.join(out_dir, 'metrics.csv'))
      xs = np.array([r['x_mean'] for r in rows])
      curves[name] = xs
      final_x[name] = float(xs[-FLAGS.average_last:].mean())
      client_steps[name] = int(round(sum(r['client_work/client_steps'] for r in rows)
                                     / FLAGS.clients_per_round))
      steps = schedules.LocalSteps(spec['local_steps'], spec.get('local_steps_decay', 1.0))
      assert client_steps[name] == steps.total(FLAGS.rounds), (name, client_steps[name])

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


def _initial(task):
  import tensorflow_federated as tff
  model = task.model_fn()  # x_1 = 0.4 in every coordinate: no randomness
  return tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_variables], non_trainable=[])


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
