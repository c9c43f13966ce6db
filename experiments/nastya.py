"""Paper 001: Nastya's server step size on l2-regularised logistic regression.

    python -m experiments.nastya                          # embedded breast-cancer data
    python -m experiments.nastya --libsvm_path=mushrooms --rounds=100

For a fixed small client step gamma, on the `logistic` task (B = --batch_size,
default 1: the paper's incremental passes), compares

  nastya_eta<m>/L   Nastya, server SGD with eta = m/L for m in --eta_multipliers
  fedrr             FedRR = Nastya with eta_i = gamma n_i (server averages models)
  local_sgd_wr      local SGD WITH replacement: each client takes n_i steps on
                    examples drawn with replacement, server averages models
                    (`tasks.libsvm.with_replacement`; FedRR's sampling swapped)
  nastya_adam       server Adam (--adam_lr) on g_t
  nastya_adaptive   the Malitsky-Mishchenko server step from eta_0 = 1/L

in three settings: single node (N = 1), N = --num_clients with full
participation, and with --clients_per_round of them per round. Each round the
loss gap f(x_t) - f* is computed in numpy on the global model (f* by Newton's
method to ||grad|| <= 1e-12; L = lambda_max(A^T diag(w) A)/4 + lambda).
Prints a table of final gaps, writes gaps.csv and nastya.png to --output_dir,
and prints one JSON object as its LAST line.
"""

from __future__ import annotations

import csv
import json
import math
import os

from absl import flags
import numpy as np

from experiments import report
from experiments.configs import number_list
from experiments.lib import common
from experiments.lib import runtime_flags
from tasks.catalog import LIBSVM_SOURCE

flags.adopt_module_key_flags(runtime_flags)  # --help lists them

SETTINGS = ('single', 'full', 'partial')
FIXED_RUNS = ('fedrr', 'local_sgd_wr', 'nastya_adam', 'nastya_adaptive')

flags.DEFINE_string('libsvm_path', None, 'LIBSVM file (paper: mushrooms); default: '
                    "scikit-learn's breast-cancer set, offline.")
flags.DEFINE_float('l2_reg', None, 'lambda (default L0/n, L0 the data smoothness).')
flags.DEFINE_integer('batch_size', 1, 'Client minibatch size B (n_i = local steps).')
flags.DEFINE_float('gamma', 1e-4, 'Client step gamma (small: the regime of the theory).')
flags.DEFINE_list('eta_multipliers', ['0.25', '0.5', '1', '1.5'],
                  'Nastya server steps eta = m / L.')
flags.DEFINE_float('adam_lr', 0.05, 'Server Adam learning rate.')
flags.DEFINE_integer('rounds', 30, 'Rounds per run.')
flags.DEFINE_list('settings', list(SETTINGS), f'Settings to run, from {SETTINGS}.')
flags.DEFINE_list('runs', None, 'Runs to do (default all): nastya_eta<m>, '
                  + ', '.join(FIXED_RUNS) + '.')
flags.DEFINE_integer('num_clients', 10, 'N for the multi-client settings.')
flags.DEFINE_integer('clients_per_round', 3, 'C for partial participation.')
flags.DEFINE_enum('partition', 'iid', ['iid', 'sorted', 'dirichlet'], 'Client split.')
flags.DEFINE_enum('shuffle', 'rr', ['rr', 'so'], "Nastya/FedRR passes: 'rr' Random "
                  "Reshuffling, 'so' Shuffle-Once.")
flags.DEFINE_integer('seed', 0, 'Seed of the split, sampling and shuffling.')
flags.DEFINE_string('output_dir', 'runs/nastya', 'Where gaps.csv and nastya.png go.')
flags.DEFINE_bool('progress', False, 'Show progress bars.')
FLAGS = flags.FLAGS


def run_names() -> list[str]:
  names = [f'nastya_eta{float(m):g}/L' for m in FLAGS.eta_multipliers] + list(FIXED_RUNS)
  if FLAGS.runs:
    unknown = [r for r in FLAGS.runs if r not in names]
    if unknown:
      raise ValueError(f'--runs: unknown {unknown}; choose from {names}')
    names = [n for n in names if n in FLAGS.runs]
  return names


def check_libsvm_path(path: str) -> None:
  """Refuses a --libsvm_path that cannot be opened, before TensorFlow loads,
  saying what the flag takes and where the paper's file comes from (the
  loader's own message names the file only)."""
  try:
    open(path, 'rb').close()
  except OSError as e:
    raise ValueError(
        f'--libsvm_path: cannot read {path!r} ({e.strerror}); give a LIBSVM-format file '
        f'(.bz2/.gz read as they are), e.g. the paper\'s mushrooms from {LIBSVM_SOURCE}, '
        'or leave the flag out for the embedded breast-cancer set') from None


def validate():
  """Every flag checked in well under a second, before TensorFlow loads."""
  runtime_flags.check()
  unknown = [s for s in FLAGS.settings if s not in SETTINGS]
  if unknown:
    raise ValueError(f'--settings: unknown {unknown}; choose from {list(SETTINGS)}')
  for name in ('rounds', 'batch_size', 'num_clients', 'clients_per_round'):
    if getattr(FLAGS, name) < 1:
      raise ValueError(f'--{name} must be >= 1')
  if FLAGS.clients_per_round > FLAGS.num_clients:
    raise ValueError('--clients_per_round cannot exceed --num_clients')
  if not FLAGS.gamma > 0 or not FLAGS.adam_lr > 0:
    raise ValueError('--gamma and --adam_lr must be > 0')
  number_list('eta_multipliers', FLAGS.eta_multipliers, bound='> 0', example='0.5,1',
              nonempty=False)  # none: only the fixed runs
  if FLAGS.libsvm_path:
    check_libsvm_path(FLAGS.libsvm_path)
  run_names()


def setting_shape(setting: str) -> tuple[int, int]:
  """(N clients, C per round)."""
  if setting == 'single':
    return 1, 1
  n = FLAGS.num_clients
  return n, (n if setting == 'full' else FLAGS.clients_per_round)


def run_config(name: str, gamma: float, inv_l: float):
  """(build key, eta, config) of run `name` at client step gamma, 1/L = `inv_l`."""
  from tff_algos.algorithms import nastya  # pylint: disable=g-import-not-at-top
  if name.startswith('nastya_eta'):
    eta = float(name[len('nastya_eta'):-2]) * inv_l
    return (name, eta), eta, nastya.NastyaConfig(client_learning_rate=gamma,
                                                 server_learning_rate=eta)
  if name in ('fedrr', 'local_sgd_wr'):
    return ('fedrr',), float('nan'), nastya.FedRRConfig(client_learning_rate=gamma)
  if name == 'nastya_adam':
    return (name,), FLAGS.adam_lr, nastya.NastyaConfig(
        client_learning_rate=gamma, server_optimizer='adam', server_learning_rate=FLAGS.adam_lr)
  return (name, inv_l), inv_l, nastya.NastyaConfig(
      client_learning_rate=gamma, server_learning_rate=inv_l, server_adaptive_lr=True)


def main(argv):
  del argv
  try:
    validate()
  except ValueError as e:
    return common.fail(e)
  common.quiet_logs()
  common.writable_dir(FLAGS.output_dir, 'output_dir')
  from tasks import TaskError, TaskOptions, get_task, libsvm
  from tff_algos.algorithms import nastya
  from tff_algos import training

  def task_for(setting):
    n, _ = setting_shape(setting)
    return get_task('logistic', TaskOptions(
        batch_size=FLAGS.batch_size, libsvm_path=FLAGS.libsvm_path, l2_reg=FLAGS.l2_reg,
        num_clients=n, partition=FLAGS.partition, seed=FLAGS.seed))

  try:
    tasks = {s: task_for(s) for s in FLAGS.settings}
  except TaskError as e:
    return common.fail(e)
  problems = {s: libsvm.problem_of(t) for s, t in tasks.items()}
  optima = {s: p.solve()[1] for s, p in problems.items()}
  # L differs by setting only through the client weights; the step sizes use
  # each setting's own L.
  smooth = {s: p.smoothness() for s, p in problems.items()}
  names, gamma = run_names(), FLAGS.gamma
  model_fn = next(iter(tasks.values())).model_fn   # same d and lambda everywhere
  info = next(iter(tasks.values())).info
  print(f'logistic on {info["source"]}: n = {info["num_train_examples"]}, '
        f'd = {info["num_features"]}, lambda = {info["l2_reg"]:.4g}; gamma = {gamma:g}, '
        f'B = {FLAGS.batch_size}, {FLAGS.rounds} rounds, shuffle = {FLAGS.shuffle}',
        flush=True)

  curves: dict[str, dict[str, np.ndarray]] = {s: {} for s in FLAGS.settings}
  etas: dict[str, dict[str, float]] = {s: {} for s in FLAGS.settings}
  with runtime_flags.managed_context():
    built = {}

    def algorithm(name, setting):
      """Builds once per (name, eta): processes do not depend on N or C."""
      key, eta, config = run_config(name, gamma, 1.0 / smooth[setting])
      if key not in built:
        built[key] = (nastya.build_fedrr(model_fn, config) if key == ('fedrr',)
                      else nastya.build_nastya(model_fn, config, name=name))
      return built[key], eta

    for setting in FLAGS.settings:
      n, c = setting_shape(setting)
      task, prob, f_star = tasks[setting], problems[setting], optima[setting]
      for name in names:
        alg, etas[setting][name] = algorithm(name, setting)
        run_task = libsvm.with_replacement(task) if name == 'local_sgd_wr' else task
        gaps = [prob.loss(np.zeros(info['num_features'])) - f_star]
        record = lambda done, state, row: gaps.append(
            prob.loss(np.asarray(state.global_model_weights.trainable[0])) - f_star)
        training.run_training(alg, run_task, training.RunConfig(
            total_rounds=FLAGS.rounds, clients_per_round=c, seed=FLAGS.seed,
            rounds_per_eval=0, progress=FLAGS.progress,
            shuffle='rr' if name == 'local_sgd_wr' else FLAGS.shuffle),
                              round_callback=record)
        curves[setting][name] = np.asarray(gaps)
        print(f'  {setting:8s} N={n:<3d} C={c:<3d} {name:18s} '
              f'gap {gaps[-1]:.3e}', flush=True)

  # fedrr has no server step size of its own (eta_i = gamma n_i, per client):
  # its row said 'nan', which read as a failed run.
  table = [[s, *setting_shape(s), name,
            'gamma n_i' if math.isnan(etas[s][name]) else etas[s][name], curves[s][name][-1]]
           for s in FLAGS.settings for name in names]
  print(report.format_table(['setting', 'N', 'C', 'run', 'eta', f'gap@{FLAGS.rounds}'],
                            table, floatfmt='.3e'))
  print('f* / L per setting: ' + ', '.join(
      f'{s}: {optima[s]:.10f} / {smooth[s]:.4f}' for s in FLAGS.settings)
        + f'; fedrr eta = gamma n_i, n_i = ceil(m_i/B)')
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  write_csv(curves)
  figure = plot(curves)
  print(f'figure: {figure}')
  print(json.dumps(dict(
      final_gap={s: {k: float(v[-1]) for k, v in c.items()} for s, c in curves.items()},
      f_star=optima, smoothness=smooth, l2_reg=info['l2_reg'], gamma=gamma,
      batch_size=FLAGS.batch_size, rounds=FLAGS.rounds, shuffle=FLAGS.shuffle,
      settings={s: dict(zip(('num_clients', 'clients_per_round'), setting_shape(s)))
                for s in FLAGS.settings},
      source=info['source'])))
  return 0


def write_csv(curves) -> str:
  path = os.path.join(FLAGS.output_dir, 'gaps.csv')
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['setting', 'run', 'round', 'gap'])
    for setting, runs in curves.items():
      for name, gaps in runs.items():
        writer.writerows([setting, name, t, repr(float(g))] for t, g in enumerate(gaps))
  return path


def plot(curves) -> str:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), squeeze=False)
  for ax, (setting, runs) in zip(axes[0], curves.items()):
    n, c = setting_shape(setting)
    for name, gaps in runs.items():
      ax.semilogy(np.arange(len(gaps)), np.maximum(gaps, 1e-16), label=name,
                  ls='--' if name in ('fedrr', 'local_sgd_wr') else '-')
    ax.set_title(f'{setting}: N = {n}, C = {c}, gamma = {FLAGS.gamma:g}')
    ax.set_xlabel('round t')
    ax.legend(fontsize=7)
  axes[0][0].set_ylabel('f(x_t) - f*')
  fig.tight_layout()
  path = os.path.join(FLAGS.output_dir, 'nastya.png')
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


if __name__ == '__main__':
  common.run(main)
