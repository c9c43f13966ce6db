r"""Paper 002 §8-9: LocalUpdate learning-rate studies and LocalUpdateDecay.

    python -m experiments.local_update_decay --figure=fig2 --tasks=emnist_character \
        --cache_dir=~/.tff --rounds=1500                       # real data (GPU box)
    python -m experiments.local_update_decay --figure=fig8 --use_synthetic_data \
        --rounds=4 --gammas=1,0.1 --etas=0.1,1                  # pipeline check

Figures (Theta = Theta_{1:10}, K = 10; M = 10, or 50 for StackOverflow;
B = 20 / 4 (Shakespeare) / 16 (StackOverflow)):
  fig2  server SGD, eta = 0.01, gamma sweep                    (EMNIST, CIFAR-100, Shakespeare)
  fig5  server SGD, gamma sweep, eta tuned per gamma           (same tasks)
  fig6  server Yogi, eta = 0.01, gamma sweep                   (StackOverflow tag and word)
  fig7  server Yogi, gamma sweep, eta tuned per gamma          (StackOverflow)
  fig8  fig5 plus LocalUpdateDecay (gamma, eta of Table 2)     (EMNIST, CIFAR-100, Shakespeare)
  fig9  fig7 plus LocalUpdateDecay with server Yogi            (StackOverflow)
Every run records the clients' loss at x_t before training ("loss at current
round", the paper's estimate of f(x)); a tuned eta is the one with the lowest
mean of it over the last `--select_last_rounds` rounds (paper: 100). Writes one
figure per task and a table; the LAST line is a JSON summary.
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

SGD_TASKS = ('emnist_character', 'cifar100_image', 'shakespeare_character')
SO_TASKS = ('stackoverflow_tag', 'stackoverflow_word')
SETUP = {  # model, clients per round M, batch B (paper 002 §8)
    'emnist_character': ('cnn_dropout', 10, 20),
    'cifar100_image': ('resnet18', 10, 20),
    'shakespeare_character': ('lstm', 10, 4),
    'stackoverflow_tag': ('logreg', 50, 16),
    'stackoverflow_word': ('lstm', 50, 16),
}
# Table 2: log10 of (gamma, eta) for LocalUpdateDecay.
TABLE2 = {'cifar100_image': (0, -1), 'emnist_character': (-1, -1),
          'shakespeare_character': (0, 1.5), 'stackoverflow_word': (-1, -1.5),
          'stackoverflow_tag': (2, 0)}
FIGURES = {
    'fig2': dict(tasks=SGD_TASKS, server='sgd', tune=False, decay=False),
    'fig5': dict(tasks=SGD_TASKS, server='sgd', tune=True, decay=False),
    'fig6': dict(tasks=SO_TASKS, server='yogi', tune=False, decay=False),
    'fig7': dict(tasks=SO_TASKS, server='yogi', tune=True, decay=False),
    'fig8': dict(tasks=SGD_TASKS, server='sgd', tune=True, decay=True),
    'fig9': dict(tasks=SO_TASKS, server='yogi', tune=True, decay=True),
}
PAPER_GAMMAS = ['0', '0.001', '0.01', '0.1', '1', '10', '100']
PAPER_ETAS = [f'{10 ** e:.6g}' for e in np.arange(-3, 1.01, 0.5)]

flags.DEFINE_enum('figure', 'fig8', list(FIGURES), 'Which figure to reproduce.')
flags.DEFINE_list('tasks', None, 'Tasks (default: the figure\'s).')
flags.DEFINE_list('gammas', PAPER_GAMMAS, 'Client learning rates gamma.')
flags.DEFINE_list('etas', PAPER_ETAS, 'Server learning-rate grid for tuning.')
flags.DEFINE_float('fixed_eta', 0.01, 'eta of the untuned figures (paper: 0.01).')
flags.DEFINE_integer('rounds', 1500, 'Rounds per run.')
flags.DEFINE_integer('select_last_rounds', 100, 'Tuning window (paper: 100 rounds).')
flags.DEFINE_integer('decay_window', 100, 'LocalUpdateDecay W = P = C (paper: 100).')
flags.DEFINE_string('cache_dir', None, 'TFF dataset cache directory.')
flags.DEFINE_bool('use_synthetic_data', False, "TFF's synthetic data (pipeline check).")
flags.DEFINE_integer('seed', 0, 'Seed of client sampling (same for every run).')
flags.DEFINE_string('root_output_dir', 'runs/local_update_decay', 'Output root.')
flags.DEFINE_bool('progress', True, 'Progress bars.')
FLAGS = flags.FLAGS


def _run(task, name, algorithm, clients, out_root):
  from tff_algos import training
  out = os.path.join(out_root, name)
  training.run_training(algorithm, task, training.RunConfig(
      total_rounds=FLAGS.rounds, clients_per_round=clients, seed=FLAGS.seed,
      rounds_per_eval=0, rounds_per_checkpoint=max(1, min(50, FLAGS.rounds)),
      output_dir=out, progress=FLAGS.progress))
  rows = report.read_metrics(os.path.join(out, 'metrics.csv'))
  return np.array([r.get('client_work/pre_training_loss', np.nan) for r in rows])


def _tail(curve) -> float:
  tail = curve[-FLAGS.select_last_rounds:]
  return float(np.nanmean(tail)) if np.isfinite(tail).any() else float('inf')


def main(argv):
  del argv
  common.quiet_logs()
  fig = FIGURES[FLAGS.figure]
  task_names = FLAGS.tasks or list(fig['tasks'])
  try:
    runtime_flags.check()
    gammas = [float(g) for g in FLAGS.gammas]
    etas = [float(e) for e in FLAGS.etas] if fig['tune'] else [FLAGS.fixed_eta]
    unknown = [t for t in task_names if t not in SETUP]
    if unknown:
      raise ValueError(f'unknown tasks {unknown}; choose from {list(SETUP)}')
    if FLAGS.rounds < 1 or FLAGS.select_last_rounds < 1:
      raise ValueError('--rounds and --select_last_rounds must be >= 1')
  except ValueError as e:
    return common.fail(e)

  from tasks import TaskOptions, get_task
  from tff_algos import local_update
  from tff_algos.core import optimizers

  def server(eta):
    return optimizers.OptimizerSpec(fig['server'], eta)

  table, summary = [], {}
  with runtime_flags.managed_context():
    for task_name in task_names:
      model, m, batch = SETUP[task_name]
      task = get_task(task_name, TaskOptions(
          batch_size=batch, cache_dir=FLAGS.cache_dir, model=model,
          use_synthetic_data=FLAGS.use_synthetic_data, seed=FLAGS.seed))
      clients = min(m, len(task.client_ids))
      out_root = os.path.join(FLAGS.root_output_dir, FLAGS.figure, task_name)
      curves = {}
      for gamma in gammas:
        best = None
        for eta in etas:
          cfg = local_update.LocalUpdateConfig(
              theta=(1.0,) * 10, client_learning_rate=gamma,
              server_optimizer=server(eta), measure_pre_training_loss=True)
          alg = local_update.build_local_update(task.model_fn, cfg)
          curve = _run(task, f'lu_g{gamma:g}_e{eta:g}', alg, clients, out_root)
          if best is None or _tail(curve) < _tail(best[1]):
            best = (eta, curve)
        curves[f'gamma={gamma:g}'] = best[1]
        table.append([task_name, 'LocalUpdate', gamma, best[0], _tail(best[1])])
      if fig['decay']:
        log_g, log_e = TABLE2[task_name]
        best = None
        for eta in etas:
          cfg = local_update.LocalUpdateConfig(
              theta=(1.0,) * 10, client_learning_rate=10.0 ** log_g,
              server_optimizer=server(eta))
          w = FLAGS.decay_window
          alg = local_update.build_local_update_decay(
              task.model_fn, cfg, local_update.DecayConfig(window=w, patience=w, cooldown=w))
          curve = _run(task, f'lud_g{10.0 ** log_g:g}_e{eta:g}', alg, clients, out_root)
          if best is None or _tail(curve) < _tail(best[1]):
            best = (eta, curve)
        curves['LocalUpdateDecay'] = best[1]
        table.append([task_name, 'LocalUpdateDecay', 10.0 ** log_g, best[0], _tail(best[1])])
      summary[task_name] = {k: _tail(v) for k, v in curves.items()}
      _plot(task_name, curves, os.path.join(FLAGS.root_output_dir, FLAGS.figure,
                                            f'{task_name}.png'))

  print(report.format_table(['task', 'method', 'gamma', 'eta', 'loss_tail'], table,
                            floatfmt='.4g'))
  print(json.dumps(dict(figure=FLAGS.figure, rounds=FLAGS.rounds,
                        synthetic=FLAGS.use_synthetic_data, tail_loss=summary)))
  return 0


def _plot(task_name, curves, path):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, curve in curves.items():
    ax.plot(np.arange(1, len(curve) + 1), curve, label=label,
            lw=2 if label == 'LocalUpdateDecay' else 1)
  ax.set_yscale('log')
  ax.set_xlabel('round')
  ax.set_ylabel('loss at x_t (sampled clients, before training)')
  ax.set_title(f'{FLAGS.figure}: {task_name}')
  ax.legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == '__main__':
  common.run(main)
