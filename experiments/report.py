"""Tables and figures from run outputs (metrics.csv, summary.json).

    python -m experiments.report --run_dirs=runs/my_run[,runs/other]

prints each run's table of evaluations and final evaluation again and redraws
its curves.png, without TensorFlow (a stopped run's too).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Iterable, Optional, Sequence
import warnings



def read_metrics(path: str) -> list[dict]:
  """`tff_algos.training.run_dir.read_metrics`, the one reader of metrics.csv (no TensorFlow)."""
  from tff_algos.training import run_dir  # pylint: disable=g-import-not-at-top
  return run_dir.read_metrics(path)


COUNTS = ('num_examples', 'num_batches', 'num_tokens')  # sizes of the test set, not scores


def eval_metric_names(rows: Sequence[dict]) -> list[str]:
  names = []
  for row in rows:
    for k in row:
      if k.startswith('eval/') and k not in names and not k.endswith(COUNTS):
        names.append(k)
  return names


def metric_names(rows: Sequence[dict]) -> list[str]:
  """The metrics.csv columns a run could be scored by: its evaluation's metrics,
  then its clients' training metrics (not the test set's or a round's sizes)."""
  train = []
  for row in rows:
    for k in row:
      if '/train/' in k and k not in train and not k.endswith(COUNTS):
        train.append(k)
  return eval_metric_names(rows) + train


def format_table(header: Sequence[str], rows: Iterable[Sequence], floatfmt: str = '.4f') -> str:
  def fmt(v):
    if isinstance(v, float):
      return 'nan' if math.isnan(v) else format(v, floatfmt)
    return str(v)
  body = [[fmt(v) for v in r] for r in rows]
  widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
            for i, h in enumerate(header)]
  line = lambda cells: '  '.join(c.rjust(w) for c, w in zip(cells, widths))
  out = [line(header), line(['-' * w for w in widths])]
  out += [line(r) for r in body]
  return '\n'.join(out)


TRAINING_TABLE_LEGEND = ('round_*: that round alone (train loss: mean over its clients, '
                         'nan if all diverged); eval_*: the model after that round; '
                         'cum_*: rounds 1 to that round')


TABLE_LINES = 10  # rows shown for a task without evaluations (e.g. the quadratic toy)


def training_table(rows: Sequence[dict]) -> str:
  """One line per evaluation: the round's train loss and time, the evaluation,
  and the cost so far; the last line says which columns are which. A task
  without evaluations (no test set) gets about `TABLE_LINES` evenly spaced
  rounds and the last one, so its train loss is not left out."""
  evals = eval_metric_names(rows)
  stride = max(1, math.ceil(len(rows) / TABLE_LINES))
  shown = lambda i, row: (any(e in row for e in evals) if evals else
                          int(row['round']) % stride == 0 or i == len(rows) - 1)
  header = ['round', 'round_train_loss'] + ['eval_' + e[len('eval/'):] for e in evals] + [
      'cum_client_steps', 'cum_upload_MB', 'round_time_s']
  table, steps, up = [], 0.0, 0.0
  for i, row in enumerate(rows):
    steps += row.get('client_work/client_steps', 0.0)
    up += row.get('upload_bytes', 0.0)
    if shown(i, row):
      table.append([int(row['round']), row.get('client_work/train/loss', float('nan'))] +
                   [row.get(e, float('nan')) for e in evals] +
                   [int(steps), up / 1e6, row.get('round_time_s', float('nan'))])
  return format_table(header, table) + '\n' + TRAINING_TABLE_LEGEND


def plot_training(rows: Sequence[dict], path: str, title: Optional[str] = None) -> str:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  evals = [e for e in eval_metric_names(rows) if not e.endswith('/loss')]
  fig, axes = plt.subplots(1, 1 + len(evals[:2]), figsize=(5 * (1 + len(evals[:2])), 3.6))
  axes = axes if hasattr(axes, '__len__') else [axes]
  r = [row['round'] for row in rows if 'client_work/train/loss' in row]
  axes[0].plot(r, [row['client_work/train/loss'] for row in rows
                   if 'client_work/train/loss' in row], label='train (clients)')
  test = [(row['round'], row['eval/loss']) for row in rows if 'eval/loss' in row]
  if test:
    axes[0].plot(*zip(*test), 'o-', label='test')
  axes[0].set_xlabel('round'); axes[0].set_ylabel('loss'); axes[0].legend()
  for ax, name in zip(axes[1:], evals[:2]):
    pts = [(row['round'], row[name]) for row in rows if name in row]
    ax.plot(*zip(*pts), 'o-')
    ax.set_xlabel('round'); ax.set_ylabel(name[len('eval/'):])
  if title:
    fig.suptitle(title)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with warnings.catch_warnings():
    # A title (the experiment's name) in a script the font lacks (CJK, say)
    # is drawn with boxes; matplotlib warned once per glyph and drawing.
    warnings.filterwarnings('ignore', message=r'Glyph \d+ .*missing from', category=UserWarning)
    fig.tight_layout()
    from tff_algos.training import disk  # pylint: disable=g-import-not-at-top
    try:
      with disk.writing(path):
        fig.savefig(path, dpi=110)
    finally:
      plt.close(fig)
  return path


# ---------------------------------------------------- cost to reach a target

COST_COLUMNS = ('upload_bytes', 'download_bytes', 'client_flops')


def cost_to_reach(rows: Sequence[dict], target: float,
                  metric: str = 'eval/sparse_categorical_accuracy',
                  costs: Sequence[str] = COST_COLUMNS) -> dict:
  """Cost of a run until `metric` first reaches `target` (>=).

  Returns {'reached', 'round' (first round with metric >= target, None if
  never), <cost>: the sum of each per-round cost column over rounds 1..round
  (over every round run if never reached)}. Works for any per-round cost
  column of metrics.csv (bytes, FLOPs, models sent, client steps).
  """
  rows = sorted(rows, key=lambda r: r['round'])
  totals = {c: 0.0 for c in costs}
  for row in rows:
    for c in costs:
      value = row.get(c, 0.0)
      # A missing column counts 0; a NaN (unmeasured) cost keeps the total NaN.
      totals[c] += value if isinstance(value, (int, float)) else 0.0
    value = row.get(metric)
    if isinstance(value, (int, float)) and value >= target:
      return dict(reached=True, round=int(row['round']), **totals)
  return dict(reached=False, round=None, **totals)


def best_metric(rows: Sequence[dict], metric: str = 'eval/sparse_categorical_accuracy'
                ) -> tuple[float, Optional[int]]:
  """(highest value of `metric` over the run's evaluations, its first round)."""
  best, at = float('nan'), None
  for row in sorted(rows, key=lambda r: r['round']):
    value = row.get(metric)
    if isinstance(value, (int, float)) and math.isfinite(value) and (
        at is None or value > best):
      best, at = float(value), int(row['round'])
  return best, at


def cost_table(runs: dict, metric: str = 'eval/sparse_categorical_accuracy',
               baseline: Optional[str] = 'fedavg') -> tuple[list[str], list[list]]:
  """Paper 004 Table IV: per run, the best `metric` with the upload (GB) and
  client FLOPs (x1e12) to reach it, and the rounds, upload and FLOPs to reach
  the baseline run's best ('-' where not reached or no baseline)."""
  header = ['algorithm', 'max_acc_%', 'round', 'upload_GB', 'TFLOPs',
            'match_round', 'match_upload_GB', 'match_TFLOPs']
  base = best_metric(runs[baseline], metric)[0] if baseline in runs else math.nan
  table = []
  for name, rows in runs.items():
    best, _ = best_metric(rows, metric)
    own = cost_to_reach(rows, best, metric) if math.isfinite(best) else None
    line = [name, 100 * best]
    line += ([own['round'], own['upload_bytes'] / 1e9, own['client_flops'] / 1e12]
             if own and own['reached'] else ['-'] * 3)
    match = (cost_to_reach(rows, base, metric)
             if math.isfinite(base) and name != baseline else None)
    line += ([match['round'], match['upload_bytes'] / 1e9, match['client_flops'] / 1e12]
             if match and match['reached'] else ['-'] * 3)
    table.append(line)
  return header, table


def markdown_table(header: Sequence[str], rows: Iterable[Sequence],
                   floatfmt: str = '.4g') -> str:
  def fmt(v):
    return format(v, floatfmt) if isinstance(v, float) else str(v)
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(fmt(v) for v in r) + ' |' for r in rows]
  return '\n'.join(lines)


def print_run_results(out_dir: str, final_eval: Optional[dict]) -> None:
  """The table of evaluations, curves.png and the final evaluation. When
  metrics.csv has no rows (deleted after the run finished; the checkpoint kept
  the totals), a note replaces the table and the figure. `final_eval` None: the
  run has not finished (no summary.json)."""
  path = os.path.join(out_dir, 'metrics.csv')
  rows = read_checked_metrics(out_dir) if os.path.exists(path) else []
  if rows:
    print(training_table(rows))
    figure = plot_training(rows, os.path.join(out_dir, 'curves.png'),
                           title=os.path.basename(out_dir))
  else:
    print(f'note: {path} is missing or empty, so no table or figure; summary.json '
          'keeps the totals', file=sys.stderr)
  if final_eval is None:
    print('final eval: none yet (no summary.json: the run has not finished; rerun its '
          'command to resume it)')
  else:
    final = ', '.join(f'{k}={v:.4f}' for k, v in final_eval.items()
                      if k not in COUNTS)
    print(f'final eval: {final or "none (this task has no evaluation set)"}')
  if rows:
    print(f'metrics: {path}  figure: {figure}')




def read_checked_metrics(out_dir: str) -> list[dict]:
  """metrics.csv's rows (a garbage line refused, naming file and line, as the
  trainer refuses it), the rows up to the run's newest checkpoint checked
  against what its checkpoints.json entry vouches for."""
  from tff_algos.training import run_dir  # pylint: disable=g-import-not-at-top
  path = os.path.join(out_dir, 'metrics.csv')
  _, rows = run_dir.read_metrics_csv(path)
  manifest = run_dir.Manifest(out_dir)  # an unreadable one refused
  if manifest.entries:
    last = max(manifest.entries)
    run_dir.check_rows(path, [r for r in rows if float(r['round']) <= last], last,
                       manifest.entries[last], rebuild=False)
  return [{k: float(v) for k, v in row.items() if v != ''} for row in rows]


def read_final_eval(path: str) -> dict:
  """summary.json's final evaluation; `UserError` for a file that is not the
  trainer's (damaged: changed bytes too, by its checksum), which the run's
  command rebuilds."""
  from tff_algos.training import summary_file  # pylint: disable=g-import-not-at-top
  final = summary_file.read(path).get('final_eval') or {}
  if not isinstance(final, dict) or not all(
      isinstance(v, (int, float)) for v in final.values()):
    raise summary_file.unreadable(path, 'final_eval is not a table of numbers')
  return final


def print_runs(run_dirs: Sequence[str]) -> None:
  """Each run's table of evaluations and final evaluation printed again and its
  curves.png redrawn, without TensorFlow (a stopped run's too)."""
  from tff_algos.errors import UserError  # pylint: disable=g-import-not-at-top
  if not run_dirs:
    raise UserError('--run_dirs is empty; give the directories experiments.train wrote, '
                    'e.g. --run_dirs=runs/<experiment_name>')
  for d in run_dirs:
    if not any(os.path.exists(os.path.join(d, f)) for f in ('metrics.csv', 'summary.json')):
      raise UserError(f'--run_dirs: {d} holds no metrics.csv or summary.json; give a run '
                      'directory that experiments.train wrote (its '
                      '--root_output_dir/--experiment_name)')
  for i, d in enumerate(run_dirs):
    if len(run_dirs) > 1:
      print(f'{"" if i == 0 else chr(10)}== {d}')
    summary_path = os.path.join(d, 'summary.json')
    final_eval = None
    if os.path.exists(summary_path):
      final_eval = read_final_eval(summary_path)
    print_run_results(d, final_eval)


def define_flags() -> None:
  """The binary's flags: defined when it runs, not when the other binaries import it."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_list('run_dirs', [], 'Run directories written by experiments.train '
                    '(<root_output_dir>/<experiment_name>), comma-separated.')


def main(argv) -> int:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  print_runs(flags.FLAGS.run_dirs)
  return 0


if __name__ == '__main__':
  from experiments.lib import common  # pylint: disable=g-import-not-at-top
  define_flags()
  common.run(main)
