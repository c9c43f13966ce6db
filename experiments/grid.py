r"""Hyperparameter grid over the trainer (paper 000 Tables 4-5 style searches).

    python -m experiments.grid --task=digits --total_rounds=200 --rounds_per_eval=20 \
      --local_steps=10 --grid='client_learning_rate=0.3,0.1;local_steps=3,10;local_steps_decay=1,0.99' \
      --group_by=local_steps --select_last_rounds=100

Every trainer flag is accepted and gives the base values; `--grid` lists
`flag=v1,v2,...` groups of trainer flags separated by ';'. Each combination is
one run in <root_output_dir>/<grid_name>/<combination> (resumable like the
trainer); all of them run in this one process, or with `--jobs=N` in N worker
processes at once (each with the chosen backend; the same models). A
run's score is the mean of `--select_metric` over the evaluations of its last
`--select_last_rounds` rounds (paper 000: highest mean test accuracy over the
last 500 rounds); a run whose metrics.csv has no such column scores nan, and
a note names the metrics it has. Prints every run sorted by score, the best
per `--group_by` value, and writes grid.csv.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import itertools
import os
import sys
import types

from absl import flags
import numpy as np

from experiments import report
from experiments.lib import common
from experiments.lib import flags as trainer_flags
from experiments.lib import runtime_flags
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.training import run_dir

flags.adopt_module_key_flags(trainer_flags)  # --help lists the flags of both
flags.adopt_module_key_flags(runtime_flags)

flags.DEFINE_string('grid', '', "Grid, e.g. 'client_learning_rate=1,0.1;local_steps=10,33'.")
flags.DEFINE_string('grid_name', None, 'Directory name of the grid (default: the task).')
flags.DEFINE_string('select_metric', 'eval/sparse_categorical_accuracy',
                    'metrics.csv column to score runs by (higher is better).')
flags.DEFINE_integer('select_last_rounds', 500, 'Score = mean over evals in this many final rounds.',
                     lower_bound=1)
flags.DEFINE_list('group_by', [], 'Report the best run for each value of these grid flags.')
flags.DEFINE_integer('jobs', 1, 'Runs trained at once, each in its own worker process (spawned, '
                     'with this backend); 1: one after the other in this process. The '
                     'models do not depend on it. Each process loads TensorFlow and the task.',
                     lower_bound=1)
FLAGS = flags.FLAGS


def parse_grid(spec: str) -> list[tuple[str, list[str]]]:
  """The axes of `spec`, each a trainer flag and its values as written.

  An axis given twice, or a value given twice in one axis (also as another
  spelling of the same value: 0.1 and 0.10), is refused: the later axis
  replaced the earlier one (half the grid never ran, and grid.csv got the
  column twice), and a repeated value trains the same run again (into the
  same directory, or one more that only the spelling tells apart).
  """
  axes = []
  trainer = {f.name for f in FLAGS.get_flags_for_module(trainer_flags)}
  for part in filter(None, (p.strip() for p in spec.split(';'))):
    if '=' not in part:
      raise ValueError(f'grid axis {part!r} is not flag=v1,v2')
    name, values = part.split('=', 1)
    name = name.strip()
    if name not in trainer:
      raise ValueError(f'unknown flag {name!r} in --grid (a grid axis is a trainer flag)')
    if name in dict(axes):
      raise ValueError(f'--grid gives the axis {name!r} twice; list all its values in one '
                       f'group: {name}=v1,v2,...')
    vals = [v.strip() for v in values.split(',') if v.strip()]
    if not vals:
      raise ValueError(f'grid axis {name!r} has no values')
    seen = []  # (as written, as parsed); a list: a list flag's value is unhashable
    for v in vals:
      try:
        parsed = FLAGS[name].parser.parse(v)
      except (ValueError, flags.Error):  # `combinations` says it, with the combination
        parsed = v
      for written, other in seen:
        if other == parsed:
          same = '' if written == v else f' ({written!r} and {v!r} are the same value)'
          raise ValueError(f'--grid axis {name!r} lists the value {v!r} twice{same}; '
                           'give each value once')
      seen.append((v, parsed))
    axes.append((name, vals))
  if not axes:
    raise ValueError('--grid is empty')
  return axes


def combinations(args: trainer_flags.TrainerArgs, axes
                 ) -> list[tuple[dict[str, str], trainer_flags.TrainerArgs]]:
  """(axis values as written, the trainer's values with them) per combination."""
  out = []
  for values in itertools.product(*[v for _, v in axes]):
    combo = dict(zip([a for a, _ in axes], values))
    try:
      parsed = {k: FLAGS[k].parser.parse(v) for k, v in combo.items()}
    except (ValueError, flags.Error) as e:
      raise ValueError(f'--grid {combination_name(combo)}: {e}') from None
    out.append((combo, args.override(**parsed)))
  return out


def combination_name(combo: dict[str, str]) -> str:
  return '_'.join(f'{k}={v}' for k, v in combo.items())


def combination_dir(combo: dict[str, str]) -> str:
  """The run directory's name under the grid's: the combination's name, with '/'
  written %2F (a value such as a path nested directories) and, past the 255
  bytes a file name may have, cut and ended with a hash of the whole name."""
  name = combination_name(combo).replace('%', '%25').replace('/', '%2F')
  if len(name.encode()) > 255:
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    name = name.encode()[:240].decode(errors='ignore') + '~' + digest
  return name


def score(rows, metric: str, last_rounds: int) -> float:
  if not rows:
    return float('nan')
  final = rows[-1]['round']
  values = [r[metric] for r in rows if metric in r and r['round'] > final - last_rounds]
  return float(np.mean(values)) if values else float('nan')


def run_grid(runs, grid_dir: str, select_metric: str, select_last_rounds: int,
             jobs: int = 1) -> list[dict]:
  """Trains every (combination, TrainerArgs) of `runs`, each in
  <grid_dir>/<combination>: in this process, or in `jobs` worker processes;
  returns one result row per run, in the order of `runs` (with its final model
  weights under 'model_weights')."""
  work = [dict(index=i, total=len(runs), combo=combo, values=dict(args.values),
               given=args.given, out_dir=os.path.join(grid_dir, combination_dir(combo)),
               select_metric=select_metric, select_last_rounds=select_last_rounds,
               flag_names=dict(run_dir.FLAG_NAMES),  # a worker's refusals say ours
               # What reads the parsed flags is computed here: workers do not parse them.
               summary_flags=trainer_flags.flag_values(args),
               identity=trainer_flags.run_identity(args))
          for i, (combo, args) in enumerate(runs)]
  results = [None] * len(work)
  here = jobs <= 1 or len(work) <= 1  # map_in_processes runs these in this process
  if here:  # a seed's runs in a row: TensorFlow is seeded once per seed
    from tff_algos import training  # pylint: disable=g-import-not-at-top
    work = [work[i] for i in training.seed_major(work, lambda w: w['values']['seed'])]
  try:
    with (runtime_flags.managed_context() if here else contextlib.nullcontext()):
      with contextlib.closing(runtime_flags.map_in_processes(_train_one, work, jobs)) as done:
        for index, result in done:
          results[index] = result
  finally:
    _TASKS.clear()  # this grid's tasks and builds (a worker's die with it)
    _BUILDS.clear()
  return results


# (task name, TaskOptions) -> task, per process: `get_task` reads nothing else,
# and TaskOptions alone does not name the task (a grid over --task trained
# every run on the first task loaded).
_TASKS: dict = {}
# One build per algorithm and structure, per process: runs that differ only in
# the client schedule's numbers (client_learning_rate, local_steps, decays) or
# not at all (seeds) share it.
_BUILDS = registry.BuildCache()


def _train_one(item: dict) -> tuple[int, dict]:
  """One combination of `run_grid` (in this process or a worker): (its index, its row)."""
  from tasks import get_task  # pylint: disable=g-import-not-at-top
  from tff_algos import training  # pylint: disable=g-import-not-at-top
  run_dir.set_flag_names(**item['flag_names'])
  args = trainer_flags.TrainerArgs(types.MappingProxyType(item['values']), item['given'])
  options, hp, _ = trainer_flags.validate(args=args)
  key = (args.task, options)  # all that get_task reads: the same task exactly when equal
  if key not in _TASKS:
    _TASKS[key] = get_task(*key)
  task = _TASKS[key]
  combo = item['combo']
  made = _BUILDS.made  # not len(): past MAX_BUILDS a new build replaces an old one
  algorithm = _BUILDS.build(args.algorithm, task.model_fn,
                             algorithm_flags.config(args.algorithm, hp))
  reused = " (an earlier run's build)" if _BUILDS.made == made else ''
  print(f"[{item['index'] + 1}/{item['total']}] {combination_name(combo)}{reused}", flush=True)
  result = training.run_training(algorithm, task, trainer_flags.run_config(item['out_dir'], args),
                                 extra_summary={'flags': item['summary_flags'], 'grid': combo},
                                 identity=item['identity'])
  rows = report.read_metrics(os.path.join(item['out_dir'], 'metrics.csv'))
  missing = not any(item['select_metric'] in r for r in rows)
  return item['index'], dict(
      combo, score=score(rows, item['select_metric'], item['select_last_rounds']),
      client_steps=result.summary['totals']['client_steps'],
      upload_bytes=result.summary['totals']['upload_bytes'],
      model_weights=result.model_weights,
      # Its metrics, where it has no --select_metric (`note_missing_metric`).
      metrics=report.metric_names(rows) if missing else None)


def note_missing_metric(results: list[dict], keys: list[str], metric: str) -> None:
  """One stderr line when runs lack `metric` (a misspelt --select_metric, or the
  default eval metric on a task without an evaluation set): their scores are
  nan, which alone did not say why."""
  lacking = [r for r in results if r.get('metrics') is not None]
  if not lacking:
    return
  names = []
  for r in lacking:
    names += [n for n in r['metrics'] if n not in names]
  have = ', '.join(names) if names else 'none'
  if not any(n.startswith('eval/') for n in names):
    have += ' (no eval/ metrics: no evaluation set)'
  if len(lacking) == len(results):
    which, scores = 'no run has', 'every score'
  else:
    shown = ', '.join(combination_name({k: r[k] for k in keys}) for r in lacking[:3])
    more = ', ...' if len(lacking) > 3 else ''
    which = f'{len(lacking)} of {len(results)} runs ({shown}{more}) have no'
    scores = 'their score'
  print(f'note: {which} metric {metric!r} (--select_metric) in metrics.csv, so {scores} '
        f'is nan; their metrics: {have}. Choose one (higher is better) with '
        '--select_metric: the same command scores the finished runs again without '
        'training them', file=sys.stderr)


def _print_and_write(results: list[dict], keys: list[str], grid_dir: str) -> None:
  results.sort(key=lambda r: -np.nan_to_num(r['score'], nan=-np.inf))
  header = keys + ['score', 'client_steps', 'upload_MB']
  table = [[r[k] for k in keys] + [r['score'], int(r['client_steps']), r['upload_bytes'] / 1e6]
           for r in results]
  print(f'score = mean {FLAGS.select_metric} over the last {FLAGS.select_last_rounds} rounds '
        '(all rounds of a shorter run)')
  print(report.format_table(header, table))
  if FLAGS.group_by:
    best = {}
    for r in results:  # sorted: the first seen per group is its best
      best.setdefault(tuple(r[g] for g in FLAGS.group_by), r)
    print('best per ' + ', '.join(FLAGS.group_by) + ':')
    print(report.format_table(header, [[r[k] for k in keys] + [
        r['score'], int(r['client_steps']), r['upload_bytes'] / 1e6] for r in best.values()]))
  os.makedirs(grid_dir, exist_ok=True)
  with open(os.path.join(grid_dir, 'grid.csv'), 'w', newline='') as f:
    fields = keys + ['score', 'client_steps', 'upload_bytes']
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction='ignore')
    writer.writeheader()
    writer.writerows(results)
  print(f'grid: {os.path.join(grid_dir, "grid.csv")}')


def main(argv):
  del argv
  run_dir.set_flag_names(name='--grid_name')  # what names a grid's runs
  args = trainer_flags.TrainerArgs.from_flags()
  try:
    trainer_flags.check_dir_name('grid_name', FLAGS.grid_name)  # not outside the root
    grid_dir = os.path.join(args.root_output_dir, FLAGS.grid_name or f'grid_{args.task}')
    trainer_flags.check_not_a_file('grid_name', grid_dir)
    axes = parse_grid(FLAGS.grid)
    for g in FLAGS.group_by:
      if g not in dict(axes):
        raise ValueError(f'--group_by {g!r} is not a grid axis')
    runs = combinations(args, axes)
    # Every combination checked before any runs (and before TensorFlow loads).
    for _, run_args in runs:
      trainer_flags.validate(args=run_args)
  except (ValueError, flags.Error) as e:
    return common.fail(e)
  common.quiet_logs()  # imports TensorFlow: after the checks, so a bad grid is said at once
  results = run_grid(runs, grid_dir, FLAGS.select_metric, FLAGS.select_last_rounds,
                     FLAGS.jobs)
  _print_and_write(results, [a for a, _ in axes], grid_dir)
  note_missing_metric(results, [a for a, _ in axes], FLAGS.select_metric)
  return 0


if __name__ == '__main__':
  common.run(main)
