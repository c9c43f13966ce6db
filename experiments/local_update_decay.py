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
round", the paper's estimate of f(x)) and ||q_t|| (Fig. 3); a tuned eta is the
one with the lowest mean of the loss over the last `--select_last_rounds`
rounds (paper: 100). Writes one figure per task and a table; the LAST line is a
JSON summary whose keys name gamma as `gamma_key` does ('1e-1', '0'; 'decay'
for LocalUpdateDecay):
  tail_loss[task][g]    mean loss of the chosen run over the tuning window
  log10_eta[task][g]    log10 of the chosen eta (App. D Tables 3-7, Table 2)
  update_norm[task][g]  {'mean', 'std'} of ||q_t|| per block of
                        `--norm_block_rounds` rounds (Fig. 3: 1000)
"""

from __future__ import annotations

import json
import math
import os

from absl import flags
import numpy as np

from experiments import report
from experiments.configs import number_list
from experiments.configs import paper002
from experiments.lib import common
from experiments.lib import runtime_flags
from tff_algos.training import run_dir

flags.adopt_module_key_flags(runtime_flags)  # --help lists them

SGD_TASKS = ('emnist_character', 'cifar100_image', 'shakespeare_character')
SO_TASKS = ('stackoverflow_tag', 'stackoverflow_word')
SETUP = paper002.TASK_SETUP  # model, clients per round M, batch B
# Table 2: log10 of (gamma, eta) for LocalUpdateDecay.
TABLE2 = paper002.DECAY_LR
gamma_key = paper002.gamma_key
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
flags.DEFINE_bool('decay_reference_semantics', False,
                  "LocalUpdateDecay: the authors' code (Keras's best, window starting at inf, "
                  "example-weighted means) instead of the paper's eq. 25.")
flags.DEFINE_enum('emnist_model', 'cnn', ['cnn', 'cnn_dropout'],
                  "EMNIST model: McMahan et al.'s CNN as App. C describes (cnn) or TFF's "
                  'baseline with dropout (cnn_dropout, Reddi et al.).')
flags.DEFINE_integer('norm_block_rounds', 1000, '||q_t|| summarised per this many rounds '
                     '(Fig. 3: 1000).')
flags.DEFINE_string('cache_dir', None, 'TFF dataset cache directory.')
flags.DEFINE_bool('use_synthetic_data', False, "TFF's synthetic data (pipeline check).")
flags.DEFINE_integer('seed', 0, 'Seed of client sampling (same for every run).')
flags.DEFINE_string('root_output_dir', 'runs/local_update_decay', 'Output root.')
flags.DEFINE_bool('progress', True, 'Progress bars.')
flags.DEFINE_bool('restart', False, 'Delete the outputs already in a run directory under '
                  '--root_output_dir and start that run over (a run of other settings is '
                  'refused otherwise).')
FLAGS = flags.FLAGS


def block_stats(curve, block: int) -> dict:
  """Mean and standard deviation of `curve` per consecutive `block` rounds."""
  blocks = [curve[i:i + block] for i in range(0, len(curve), block)]
  return dict(mean=[float(np.nanmean(b)) for b in blocks],
              std=[float(np.nanstd(b)) for b in blocks])


def _run(task, name, algorithm, clients, out_root):
  """(pre-training loss, ||q_t||) per round of one run."""
  from tff_algos import training
  out = os.path.join(out_root, name)
  training.run_training(algorithm, task, training.RunConfig(
      total_rounds=FLAGS.rounds, clients_per_round=clients, seed=FLAGS.seed,
      rounds_per_eval=0, rounds_per_checkpoint=max(1, min(50, FLAGS.rounds)),
      output_dir=out, progress=FLAGS.progress, restart=FLAGS.restart))
  rows = report.read_metrics(os.path.join(out, 'metrics.csv'))
  return (np.array([r.get('client_work/pre_training_loss', np.nan) for r in rows]),
          np.array([r.get('aggregator/update_norm', np.nan) for r in rows]))


def _tail(curve) -> float:
  """Mean loss over the tuning window; inf for a run that diverged (a non-finite
  loss in the window), so that tuning never picks it."""
  tail = curve[-FLAGS.select_last_rounds:]
  return float(np.mean(tail)) if len(tail) and np.isfinite(tail).all() else float('inf')


def _tune(etas, run_one):
  """(eta, loss curve, norm curve) of the eta with the lowest tail loss."""
  best = None
  for eta in etas:
    loss, norm = run_one(eta)
    if best is None or _tail(loss) < _tail(best[1]):
      best = (eta, loss, norm)
  return best


def parse_flags(fig: dict) -> tuple[list[str], list[float], list[float]]:
  """(tasks, gammas, etas) of the run, every flag checked before TensorFlow
  loads: a server step eta must be > 0 (the summary takes its log10, after all
  the training), a client step gamma >= 0 (0: the paper's gamma = 0 curve)."""
  runtime_flags.check()
  task_names = FLAGS.tasks or list(fig['tasks'])
  # No gamma is fine when LocalUpdateDecay (its gamma: Table 2) is the only curve.
  gammas = number_list('gammas', FLAGS.gammas, bound='>= 0', example='0,0.01,0.1',
                       nonempty=not fig['decay'])
  etas = number_list('etas', FLAGS.etas, bound='> 0', example='0.01,0.1')
  if not 0 < FLAGS.fixed_eta < math.inf:
    raise ValueError(f'--fixed_eta must be a number > 0, got {FLAGS.fixed_eta!r}')
  unknown = [t for t in task_names if t not in SETUP]
  if unknown:
    raise ValueError(f'--tasks: unknown {unknown}; choose from {list(SETUP)}')
  for name in ('rounds', 'select_last_rounds', 'decay_window', 'norm_block_rounds'):
    if getattr(FLAGS, name) < 1:
      raise ValueError(f'--{name} must be >= 1')
  return task_names, gammas, etas if fig['tune'] else [FLAGS.fixed_eta]


def main(argv):
  del argv
  # What a refusal of a run directory advises, in this binary's flags.
  run_dir.set_flag_names(name='--root_output_dir', rounds='--rounds')
  fig = FIGURES[FLAGS.figure]
  try:
    task_names, gammas, etas = parse_flags(fig)
  except ValueError as e:
    return common.fail(e)
  common.quiet_logs()
  common.writable_dir(FLAGS.root_output_dir, 'root_output_dir')

  from tasks import get_task
  from tff_algos.algorithms import local_update, registry

  table = []
  summary = dict(tail_loss={}, log10_eta={}, update_norm={})
  builds = registry.BuildCache()
  with runtime_flags.managed_context():
    for task_name in task_names:
      model, m, _ = SETUP[task_name]  # B: paper002.task_options
      if task_name == 'emnist_character':
        model = FLAGS.emnist_model
      task = get_task(task_name, paper002.task_options(
          task_name, cache_dir=FLAGS.cache_dir, model=model,
          use_synthetic_data=FLAGS.use_synthetic_data, seed=FLAGS.seed))
      clients = min(m, len(task.client_ids))
      out_root = os.path.join(FLAGS.root_output_dir, FLAGS.figure, task_name)
      chosen = {}  # gamma key -> (gamma, eta, loss curve, norm curve)

      def local_update_run(gamma, eta):
        cfg = local_update.LocalUpdateConfig(
            theta=(1.0,) * 10, client_learning_rate=gamma, server_optimizer=fig['server'],
            server_learning_rate=eta, measure_pre_training_loss=True)
        # One build for the whole gamma x eta grid (both read from the state).
        alg = builds.build_config(local_update.build_local_update, task.model_fn, cfg,
                                  'local_update')
        return _run(task, f'lu_g{gamma:g}_e{eta:g}', alg, clients, out_root)

      def decay_run(gamma, eta):
        w = FLAGS.decay_window
        alg = local_update.build_local_update_decay(task.model_fn, local_update.LocalUpdateDecayConfig(
            theta=(1.0,) * 10, client_learning_rate=gamma, server_optimizer=fig['server'],
            server_learning_rate=eta, decay_window=w, decay_patience=w, decay_cooldown=w,
            decay_reference_semantics=FLAGS.decay_reference_semantics))
        return _run(task, f'lud_g{gamma:g}_e{eta:g}', alg, clients, out_root)

      for gamma in gammas:
        eta, loss, norm = _tune(etas, lambda e, g=gamma: local_update_run(g, e))
        chosen[gamma_key(gamma)] = (gamma, eta, loss, norm)
      if fig['decay']:
        gamma = 10.0 ** TABLE2[task_name][0]
        eta, loss, norm = _tune(etas, lambda e: decay_run(gamma, e))
        chosen['decay'] = (gamma, eta, loss, norm)
      for key, (gamma, eta, loss, norm) in chosen.items():
        method = 'LocalUpdateDecay' if key == 'decay' else 'LocalUpdate'
        table.append([task_name, method, gamma, eta, _tail(loss)])
      summary['tail_loss'][task_name] = {k: _tail(v[2]) for k, v in chosen.items()}
      summary['log10_eta'][task_name] = {k: round(math.log10(v[1]), 6)
                                         for k, v in chosen.items()}
      summary['update_norm'][task_name] = {
          k: block_stats(v[3], FLAGS.norm_block_rounds) for k, v in chosen.items()}
      _plot(task_name, {k: v[2] for k, v in chosen.items()},
            os.path.join(FLAGS.root_output_dir, FLAGS.figure, f'{task_name}.png'))

  print(report.format_table(['task', 'method', 'gamma', 'eta', 'loss_tail'], table,
                            floatfmt='.4g'))
  print(json.dumps(dict(figure=FLAGS.figure, rounds=FLAGS.rounds,
                        synthetic=FLAGS.use_synthetic_data,
                        emnist_model=FLAGS.emnist_model,
                        decay_semantics=('reference' if FLAGS.decay_reference_semantics
                                         else 'paper'), **summary)))
  return 0


def _plot(task_name, curves, path):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, curve in curves.items():
    ax.plot(np.arange(1, len(curve) + 1), curve,
            label='LocalUpdateDecay' if label == 'decay' else f'gamma={label}',
            lw=2 if label == 'decay' else 1)
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
