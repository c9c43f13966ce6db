"""What `experiments.reproduce` measures from its runs, and its tables.

A published quantity's key names a measured value (`run_metric`, see
experiments/configs/base.py); `measure_stats` summarises it over seeds and
`experiment_table` / `full_report` set it beside the published value.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Optional, Sequence

from experiments import report
from experiments import seed_stats
from experiments.configs import base


# ----------------------------------------------------------------------------
# Measured quantities.

def accuracy_key(rows: Sequence[dict]) -> Optional[str]:
  """The evaluation's accuracy column (StackOverflow tag prediction: recall@5)."""
  names = report.eval_metric_names(rows)
  for pattern in ('accuracy', 'recall'):
    for name in names:
      if pattern in name:
        return name
  return None


def _loss_key(rows, prefix):
  for row in rows:
    for k in row:
      if k.startswith(prefix) and k.endswith('loss'):
        return k
  return None


def _evals(rows, key):
  return [(r['round'], r[key]) for r in rows
          if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]


def _first_reaching(rows, key, target):
  for r in rows:
    v = r.get(key)
    if isinstance(v, (int, float)) and v >= target:
      return r
  return None


def _cumulative(rows, column, upto_round):
  return float(sum(r.get(column, 0.0) or 0.0 for r in rows if r['round'] <= upto_round))


def _min_moving_average(values: Sequence[float], window: int) -> Optional[float]:
  """Lowest mean of `window` consecutive values (all of them if fewer)."""
  if not values:
    return None
  window = min(window, len(values))
  sums = [sum(values[:window])]
  for i in range(window, len(values)):
    sums.append(sums[-1] + values[i] - values[i - window])
  return min(sums) / window


def run_metric(rows: Sequence[dict], summary: dict, metric: str) -> Optional[float]:
  """One measured quantity (see experiments/configs/base.py) from a run's rows."""
  acc = accuracy_key(rows)
  if metric == 'final_accuracy':
    evals = _evals(rows, acc) if acc else []
    return evals[-1][1] if evals else None
  if metric == 'max_accuracy':
    evals = _evals(rows, acc) if acc else []
    return max(v for _, v in evals) if evals else None
  m = re.fullmatch(r'mean_(\w+?)_last(\d+)', metric)
  if m:  # mean of an evaluation metric (accuracy: see accuracy_key) over the last N rounds
    key = acc if m.group(1) == 'accuracy' else f'eval/{m.group(1)}'
    if not key or not rows:
      return None
    last = rows[-1]['round']
    window = [v for r, v in _evals(rows, key) if r > last - int(m.group(2))]
    return float(sum(window) / len(window)) if window else None
  if metric in ('final_loss', 'final_train_loss'):
    key = _loss_key(rows, 'eval/' if metric == 'final_loss' else 'client_work/train/')
    evals = _evals(rows, key) if key else []
    return evals[-1][1] if evals else None
  m = re.fullmatch(r'min_train_loss_smooth(\d+)', metric)
  if m:  # paper 000's "Min Train Error": lowest N-round moving average of the train loss
    key = _loss_key(rows, 'client_work/train/')
    return _min_moving_average([v for _, v in _evals(rows, key)] if key else [],
                               int(m.group(1)))
  if metric == 'fraction_sgd_steps':  # sum_t K_t / (rounds * K_0), paper 000's Table 1
    steps = [v for _, v in _evals(rows, 'client_work/local_steps')]
    return sum(steps) / (len(steps) * steps[0]) if steps and steps[0] > 0 else None
  m = re.fullmatch(r'(rounds|models|upload_gb|flops)_to([0-9.]+)', metric)
  if m:
    kind, target = m.group(1), float(m.group(2))
    if not acc:
      return None
    if kind == 'models':  # paper 003's unit, from the run's download bytes
      model_bytes, cohort = summary.get('model_bytes'), summary.get('clients_per_round')
      if not (model_bytes and cohort):
        return None
      from tff_algos.training import targets as metrics_tables  # pylint: disable=g-import-not-at-top
      hit = metrics_tables.models_to_target(rows, target, model_bytes, cohort, metric=acc)
      return hit.models_transmitted if hit.reached else None
    reach = report.cost_to_reach(rows, target, acc, costs=('upload_bytes', 'client_flops'))
    if not reach['reached']:
      return None
    if kind == 'rounds':
      return float(reach['round'])
    if kind == 'upload_gb':
      return reach['upload_bytes'] / 1e9
    return reach['client_flops'] if any('client_flops' in r for r in rows) else None
  raise ValueError(f'unknown metric {metric!r}')


def lookup_raw(obj: Any, dotted: str) -> Any:
  for part in dotted.split('.'):
    if isinstance(obj, dict) and part in obj:
      obj = obj[part]
    else:
      return None
  return obj


def lookup(obj: Any, dotted: str) -> Optional[float]:
  obj = lookup_raw(obj, dotted)
  return float(obj) if isinstance(obj, (int, float)) else None


def _binary_stats(obj: Any) -> dict:
  """A binary's value: a number (one seed), a list of per-seed numbers, or a
  dict with a 'per_seed' list."""
  if isinstance(obj, dict) and isinstance(obj.get('per_seed'), list):
    obj = obj['per_seed']
  if isinstance(obj, list):
    return seed_stats.summarize([v if isinstance(v, (int, float)) else None for v in obj])
  return seed_stats.summarize([float(obj)] if isinstance(obj, (int, float)) else [None])


def _trainer_stats(runs: Sequence[dict], metric: str) -> dict:
  """Per-seed values of `metric` over `runs` (one label), with their summary.

  'max_accuracy' is the maximum of the seed-averaged curve (as the papers
  report it), its spread that of the seeds at the peak round.
  """
  if metric == 'max_accuracy':
    curves = [_evals(r['rows'], accuracy_key(r['rows'])) for r in runs
              if accuracy_key(r['rows'])]
    if curves and len(curves) == len(runs) and all(curves):
      peak = seed_stats.peak_of_mean_curve(curves)
      if peak is not None:
        return dict(peak, seeds=[r['seed'] for r in runs])
  values = [run_metric(r['rows'], r['summary'], metric) for r in runs]
  return dict(seed_stats.summarize(values), seeds=[r['seed'] for r in runs])


def measure_stats(exp: base.Experiment, results: dict[str, Any]) -> dict[str, dict]:
  """Published key -> summary over seeds (`seed_stats.summarize`'s fields)."""
  out = {}
  for pub in exp.published:
    if isinstance(exp.runner, base.Binary):
      out[pub.key] = _binary_stats(lookup_raw(results.get('json', {}), pub.key))
      continue
    label, _, metric = pub.key.partition('/')
    out[pub.key] = _trainer_stats([r for r in results['runs'] if r['label'] == label], metric)
  return out


def measure(exp: base.Experiment, results: dict[str, Any]) -> dict[str, Optional[float]]:
  """Published key -> our value (the mean over seeds)."""
  return {k: v['mean'] for k, v in measure_stats(exp, results).items()}


# ----------------------------------------------------------------------------
# Tables.

def _fmt(v):
  if v is None:
    return '—'
  return f'{v:.4g}'


def _interval(stats: Optional[dict]) -> str:
  if not stats or stats.get('ci95') is None:
    return '—'
  lo, hi = stats['ci95']
  return f'[{lo:.4g}, {hi:.4g}]'


def _seeds(stats: Optional[dict]) -> str:
  if not stats:
    return ''
  n = stats.get('n', 0)
  missing = stats.get('missing', 0)
  return f'{n}' + (f' (+{missing} not reached)' if missing else '')


def _inside(stats: Optional[dict], published: float) -> str:
  inside = seed_stats.contains(stats, published)
  if inside is None:
    return '— (one seed)' if stats and stats.get('n') == 1 else '—'
  return 'yes' if inside else 'no'


def experiment_table(exp: base.Experiment, results_by_scale: dict[str, dict]) -> str:
  """Published vs measured (mean, std, 95 % CI over seeds) for one experiment,
  as a markdown table; full scale preferred."""
  header = ['experiment', 'ref', 'quantity', 'published', 'ours (mean)', 'std',
            '95 % CI', 'seeds', 'published in CI', 'ours − published', 'scale', 'rounds']
  rows = []
  for pub in exp.published:
    scale, measured, stats, result = 'not run', None, None, None
    for s in ('full', 'smoke'):
      if s in results_by_scale:
        result = results_by_scale[s]
        scale, measured = s, result['measured'].get(pub.key)
        stats = (result.get('stats') or {}).get(pub.key)
        break
    if scale == 'smoke':
      scale = 'smoke only (not comparable)'
    diff = None if measured is None else measured - pub.value
    rounds = ''
    if result and result.get('rounds'):
      rounds = ','.join(sorted({str(int(v)) for v in result['rounds'].values()
                                if isinstance(v, (int, float))}))
    value = f'{pub.value:.4g}' + (' (≈, from figure)' if pub.approximate else '')
    shown = ('not reached' if measured is None and pub.to_target and scale != 'not run'
             else _fmt(measured))
    rows.append([exp.name, pub.ref, pub.label or pub.key, value, shown,
                 _fmt(stats.get('std') if stats else None), _interval(stats), _seeds(stats),
                 _inside(stats, pub.value) if measured is not None else '—',
                 _fmt(diff), scale, rounds])
  return report.markdown_table(header, rows)


def load_results(root: str) -> dict[str, dict[str, dict]]:
  """experiment -> scale -> result.json under `root`."""
  found: dict[str, dict[str, dict]] = {}
  for scale in ('full', 'smoke'):
    base_dir = os.path.join(root, scale)
    if not os.path.isdir(base_dir):
      continue
    for name in sorted(os.listdir(base_dir)):
      path = os.path.join(base_dir, name, 'result.json')
      if os.path.exists(path):
        with open(path) as f:
          found.setdefault(name, {})[scale] = json.load(f)
  return found


def full_report(root: str, experiments: dict[str, base.Experiment]) -> str:
  results = load_results(root)
  parts = ['# Reproduction report', '',
           'Published values next to ours. "ours" is the mean over seeds, with the '
           'standard deviation and the 95 % Student-t confidence interval of the mean '
           '(none with one seed); "published in CI" says whether the published value '
           'lies inside it. Max accuracy is the maximum of the seed-averaged curve, '
           'as the papers report it. "smoke only" = the pipeline ran on '
           'embedded/synthetic data for a few rounds, not comparable; "not run" = '
           'no result under this directory.', '']
  done_full = sum('full' in results.get(n, {}) for n in experiments)
  parts.append(f'{done_full} of {len(experiments)} experiments run at full scale.\n')
  figure_only = []
  for name, exp in experiments.items():
    if not exp.published:
      figure_only.append(name)
      continue
    parts.append(experiment_table(exp, results.get(name, {})))
    parts.append('')
  if figure_only:
    parts.append('Figure-only experiments (curves, no printed numbers to compare; see '
                 'each plot.png): ' + ', '.join(
                     f'{n} ({"/".join(sorted(results.get(n, {}))) or "not run"})'
                     for n in figure_only))
  return '\n'.join(parts)


def list_lines(experiments: dict[str, base.Experiment]) -> list[str]:
  lines = []
  for name, exp in experiments.items():
    kind = 'binary' if isinstance(exp.runner, base.Binary) else \
        f'{len(exp.runner.runs)} runs'
    values = [f'{p.value:.4g}' for p in exp.published]
    shown = ', '.join(values[:3]) + (f' +{len(values) - 3}' if len(values) > 3 else '')
    lines.append(f'{name:52s} {exp.ref:28s} {kind:10s} published: {shown or "—":22s} '
                 f'{exp.expected_runtime}')
  return lines


def markdown_lines(experiments: dict[str, base.Experiment]) -> list[str]:
  lines = ['| experiment | paper, ref | runs | published values | full scale needs | '
           'full-scale runtime |', '|---|---|---|---|---|---|']
  for name, exp in experiments.items():
    runs = 'binary ' + exp.runner.module.split('.')[-1] if isinstance(
        exp.runner, base.Binary) else f'{len(exp.runner.runs)} × {len(exp.runner.seeds)} seeds'
    lines.append(f'| `{name}` | {exp.paper}, {exp.ref} | {runs} | {len(exp.published)} | '
                 f'{exp.data or "nothing (offline)"} | {exp.expected_runtime or "?"} |')
  return lines
