"""Tables and figures from run outputs (metrics.csv, summary.json)."""

from __future__ import annotations

import math
import os
from typing import Iterable, Optional, Sequence

from tff_algos.training import read_metrics  # noqa: F401  (one reader of metrics.csv)


def eval_metric_names(rows: Sequence[dict]) -> list[str]:
  names = []
  for row in rows:
    for k in row:
      if k.startswith('eval/') and k not in names and not k.endswith(('num_examples', 'num_batches')):
        names.append(k)
  return names


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


def training_table(rows: Sequence[dict]) -> str:
  """One line per evaluation: round, train loss, eval metrics, cumulative cost."""
  evals = eval_metric_names(rows)
  header = ['round', 'train_loss'] + [e[len('eval/'):] for e in evals] + [
      'client_steps', 'upload_MB', 'sec/round']
  table, steps, up = [], 0.0, 0.0
  for row in rows:
    steps += row.get('client_work/client_steps', 0.0)
    up += row.get('upload_bytes', 0.0)
    if any(e in row for e in evals):
      table.append([int(row['round']), row.get('client_work/train/loss', float('nan'))] +
                   [row.get(e, float('nan')) for e in evals] +
                   [int(steps), up / 1e6, row.get('round_time_s', float('nan'))])
  return format_table(header, table)


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
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
