r"""Paper 003 (FedDyn) Tables 1/2/4/6 and convergence plots.

    python -m experiments.feddyn                                # digits, offline
    python -m experiments.feddyn --task=mnist --cache_dir=~/tensorflow_datasets \
        --total_rounds=1000 --client_epochs_per_round=10 --client_batch_size=50 \
        --targets=0.972,0.982 --feddyn_alpha=0.01 --prox_mu=1e-4
    python -m experiments.feddyn --task=synthetic_logistic --splits=iid \
        --target_metric=eval/loss --targets=0.3 --participations=0.1   # Table 6

Runs the grid  --algorithms x --participations x --splits x --unbalanced_sigmas
(x --heterogeneities for synthetic_logistic) x --run_seeds, each with
`tff_algos.training.loop.run_training` in its own directory under
<root_output_dir>/<name>/ (resumable: re-running skips what is done). Every
trainer flag gives the base values (learning rates, epochs, --feddyn_alpha,
--prox_mu, ...), except those the grid sets for each run, which are refused:
--algorithm (use --algorithms), --seed (--run_seeds), --clients_per_round and
--participation_prob (--participations), --experiment_name (--name), and
--partition, --dirichlet_alpha, --unbalanced_sigma (--splits,
--unbalanced_sigmas) or, for synthetic_logistic, --synthetic_heterogeneity
(--heterogeneities). A participation p < 1 lets each of the N clients join a round
with probability p, redrawn while none joins (`--participation_prob`; App. B.1
and the authors' code), about max(1, round(p N)) a round.

For every setting and target it reports the paper's metric, the number of
models transmitted (relative to one round of FedAvg, so SCAFFOLD counts two
per round) until the test accuracy first reaches the target, 'N+' when it
never does, with the ratio to --reference_algorithm in parentheses, and the
final accuracy (a note on stderr when runs have no --target_metric column;
an accuracy's --targets are fractions: 0.85, not 85). Writes results.csv,
tables.md and one convergence figure per setting (accuracy vs models
transmitted and vs rounds); the LAST printed line is a JSON summary.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import sys

from absl import flags
import numpy as np

from experiments import report
from experiments.configs import ListFlagError, number_list
from experiments.lib import common
from experiments.lib import flags as trainer_flags
from experiments.lib import runtime_flags
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.training import run_dir, summary_file

flags.adopt_module_key_flags(trainer_flags)  # --help lists the flags of both
flags.adopt_module_key_flags(runtime_flags)

PAPER_ALGORITHMS = ('feddyn', 'scaffold', 'fedavg', 'fedprox')
flags.DEFINE_list('algorithms', list(PAPER_ALGORITHMS), 'Algorithms to compare.')
flags.DEFINE_list('participations', ['1', '0.1', '0.01'],
                  'Fractions of the clients sampled per round.')
flags.DEFINE_list('splits', ['iid', 'dirichlet:0.6', 'dirichlet:0.3'],
                  "Client splits: 'iid', 'dirichlet:<alpha>' or, for shakespeare_003, "
                  "'natural' (one role per device).")
flags.DEFINE_list('unbalanced_sigmas', ['0'], 'Lognormal client-size sigmas '
                  '(0 balanced; Table 4 adds 0.3).')
flags.DEFINE_list('heterogeneities', [], 'synthetic_logistic only: homogeneous, type1, '
                  'type2, type3 (default: all four, Table 6).')
flags.DEFINE_list('run_seeds', ['0'], 'Seeds (split, sampling, init); cells average them.')
flags.DEFINE_list('targets', ['0.85', '0.9'], 'Target values of --target_metric.')
flags.DEFINE_string('target_metric', 'eval/sparse_categorical_accuracy',
                    'metrics.csv column the targets refer to (a *loss column is '
                    'reached from above).')
flags.DEFINE_string('reference_algorithm', 'feddyn',
                    'Ratios are other / this; one of --algorithms (left unset: feddyn, '
                    'or the first of --algorithms when feddyn is not among them).')
flags.DEFINE_string('name', None, 'Directory under --root_output_dir (default paper003_<task>).')
FLAGS = flags.FLAGS

# Trainer flags that this binary sets itself for every run, and the flag of its
# own that gives them: given on the command line they were ignored.
OWN_FLAGS = dict(experiment_name='--name', algorithm='--algorithms', seed='--run_seeds',
                 clients_per_round='--participations',
                 participation_prob='--participations')
# ... and those its data settings set: --splits and --unbalanced_sigmas, or for
# synthetic_logistic --heterogeneities.
SPLIT_FLAGS = dict(partition='--splits', dirichlet_alpha='--splits',
                   unbalanced_sigma='--unbalanced_sigmas')
SYNTHETIC_FLAGS = dict(synthetic_heterogeneity='--heterogeneities')
# Trainer-flag defaults of this binary (set when run, not on import).
DEFAULTS = dict(task='feddyn_digits', rounds_per_eval=1, client_epochs_per_round=5)


SPLITS_EXPECTED = ("each of 'iid', 'natural' or 'dirichlet:<alpha>' with alpha > 0, "
                   'e.g. iid,dirichlet:0.3')
HETEROGENEITIES = ('homogeneous', 'type1', 'type2', 'type3')


def parse_split(spec: str) -> dict:
  """'iid', 'natural' (shakespeare_003: a role per device) or 'dirichlet:<alpha>'
  -> trainer flag values; a bad one raises ListFlagError (a ValueError) naming
  --splits and the item."""
  if spec in ('iid', 'natural'):
    return {'partition': spec}
  if spec.startswith('dirichlet:'):
    alpha = spec.split(':', 1)[1]
    try:
      value = float(alpha)
    except ValueError:
      value = None
    if value is None or not 0 < value < float('inf'):
      raise ListFlagError(f'--splits: {spec!r}: alpha {alpha!r} is not a number > 0 '
                          f'({SPLITS_EXPECTED})')
    return {'partition': 'dirichlet', 'dirichlet_alpha': value}
  raise ListFlagError(f'--splits: {spec!r} is not a split ({SPLITS_EXPECTED})')


def settings() -> list[tuple[str, dict]]:
  """(label, trainer flag values) of every data setting of the grid."""
  sigmas = number_list('unbalanced_sigmas', FLAGS.unbalanced_sigmas, bound='>= 0',
                       example='0,0.3')
  heteros = list(FLAGS.heterogeneities)
  unknown = [h for h in heteros if h not in HETEROGENEITIES]
  if unknown:
    raise ValueError(f'--heterogeneities: unknown {", ".join(map(repr, unknown))}; '
                     f'choose from {", ".join(HETEROGENEITIES)}')
  if FLAGS.task == 'synthetic_logistic':
    heteros = heteros or list(HETEROGENEITIES)
    return [(h, {'synthetic_heterogeneity': h}) for h in heteros]
  if heteros:
    raise ValueError('--heterogeneities applies to --task=synthetic_logistic only')
  if not FLAGS.splits:
    raise ListFlagError(f'--splits is empty; give {SPLITS_EXPECTED}')
  from tasks import list_tasks  # pylint: disable=g-import-not-at-top
  spec = list_tasks().get(FLAGS.task)
  given = FLAGS['splits'].present or FLAGS['unbalanced_sigmas'].present
  out, left_out = [], []
  parsed = {split: parse_split(split) for split in FLAGS.splits}  # every item's form first
  for split, sigma in itertools.product(FLAGS.splits, sigmas):
    values = dict(parsed[split], unbalanced_sigma=sigma)
    label = split.replace(':', '') + ('' if sigma == 0 else f'_unbal{sigma:g}')
    if spec is not None:  # (an unknown task is refused by the runs' checks)
      if (values['partition'] == 'dirichlet' and 'partition' not in spec.splits
          and 'dirichlet_alpha' in spec.splits):
        del values['partition']  # the task's own split is Dirichlet label skew (digits)
      unread = spec.unread_splits(set(values), values)
      if unread and given:
        reads = (', '.join(f'--{o}' for o in sorted(spec.splits)) if spec.splits else
                 'none: its clients are fixed by the data')
        raise ListFlagError(
            f'--splits/--unbalanced_sigmas: {label!r} sets '
            f'{", ".join("--" + o for o in unread)}, which task {FLAGS.task!r} does not '
            f'read (it reads {reads}); give the settings it has, or leave --splits and '
            '--unbalanced_sigmas unset')
      if unread:  # a default setting the task cannot have
        left_out.append(label)
        continue
    out.append((label, values))
  if left_out:
    running = (f'running {", ".join(label for label, _ in out)}' if out else
               'one setting: its own clients')
    print(f'note: task {FLAGS.task!r} cannot split as the default --splits '
          f'{", ".join(left_out)}; {running}', file=sys.stderr)
  return out or [('natural', {})]


def clients_per_round(participation: float, num_clients: int) -> int:
  return max(1, int(round(participation * num_clients)))


def aggregate(results: list[dict], reference: str) -> dict:
  """{(setting, participation, target): {algorithm: cell}} over seeds: the
  mean count, '+' if some seed never reached the target, and the ratio to the
  reference algorithm's mean."""
  groups = {}
  for r in results:
    groups.setdefault((r['setting'], r['participation'], r['target']), {}).setdefault(
        r['algorithm'], []).append(r)
  table = {}
  for key, by_alg in groups.items():
    means = {a: float(np.mean([r['models_transmitted'] for r in rs])) for a, rs in by_alg.items()}
    reached = {a: all(r['reached'] for r in rs) for a, rs in by_alg.items()}
    final = {a: float(np.mean([r['final_value'] for r in rs])) for a, rs in by_alg.items()}
    ref = means.get(reference)
    row = {}
    for a in by_alg:
      cell = f'{means[a]:.0f}' + ('' if reached[a] else '+')
      if a != reference and ref and reached.get(reference):
        cell += f' ({">" if not reached[a] else ""}{means[a] / ref:.1f}x)'
      row[a] = dict(cell=cell, models=means[a], reached=reached[a], final=final[a])
    table[key] = row
  return table


def markdown(table: dict, algorithms: list[str], metric: str) -> str:
  header = ['setting', 'participation', 'target'] + algorithms
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for (setting, part, target), row in sorted(table.items()):
    lines.append('| ' + ' | '.join([setting, f'{part:g}', f'{target:g}'] + [
        row[a]['cell'] if a in row else '' for a in algorithms]) + ' |')
  finals = {}
  for (setting, part, _), row in table.items():
    finals[(setting, part)] = {a: row[a]['final'] for a in row}
  lines += ['', f'final {metric}:', '',
            '| ' + ' | '.join(['setting', 'participation'] + algorithms) + ' |',
            '|' + '---|' * (2 + len(algorithms))]
  for (setting, part), row in sorted(finals.items()):
    lines.append('| ' + ' | '.join([setting, f'{part:g}'] + [
        f'{row[a]:.4f}' if a in row else '' for a in algorithms]) + ' |')
  return '\n'.join(lines)


def plot_setting(curves: dict, path: str, title: str, metric: str):
  """curves: algorithm -> list of (models_cumulative, rounds, values) per seed."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  for i, (alg, runs) in enumerate(curves.items()):
    color = f'C{i}'
    for j, (models, rounds, values) in enumerate(runs):
      label = alg if j == 0 else None
      axes[0].plot(models, values, color=color, label=label, lw=1)
      axes[1].plot(rounds, values, color=color, label=label, lw=1)
  axes[0].set_xlabel('models transmitted (relative to one FedAvg round)')
  axes[1].set_xlabel('communication rounds')
  for ax in axes:
    ax.set_ylabel(metric.split('/')[-1])
    ax.legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def check_own_flags() -> None:
  """Refuses (ValueError) a trainer flag given on the command line that this
  binary sets itself for every run (it was ignored), naming the flag of its
  own to use, and a --name that is not one directory name under
  --root_output_dir ('../x' wrote outside it)."""
  own = dict(OWN_FLAGS, **(SYNTHETIC_FLAGS if FLAGS.task == 'synthetic_logistic'
                           else SPLIT_FLAGS))
  for name, instead in own.items():
    if FLAGS[name].present:
      raise ValueError(f'--{name} is not read by this binary (it sets it for each run); '
                       f'use {instead}')
  trainer_flags.check_dir_name('name', FLAGS.name)


def reference_algorithm(algorithms: list[str]) -> str:
  """--reference_algorithm, which must be one of `algorithms`; left unset, its
  default (feddyn) or, when that is not among them, the first of them."""
  ref = FLAGS.reference_algorithm
  if ref in algorithms:
    return ref
  if FLAGS['reference_algorithm'].present:
    raise ValueError(f'--reference_algorithm={ref!r} is not one of --algorithms; choose '
                     f'from {", ".join(algorithms)}')
  return algorithms[0]


def is_accuracy(metric: str) -> bool:
  return 'accuracy' in metric.split('/')[-1]


def check_targets(targets: list[float], metric: str) -> None:
  """Refuses a target above 1 for an accuracy metric (a fraction in [0, 1]: a
  percentage such as 85 was never reached, every cell 'N+')."""
  if not is_accuracy(metric):
    return
  for t in targets:
    if t > 1:
      hint = f'; write {t / 100:g} for {t:g}%' if t <= 100 else ''
      raise ValueError(f'--targets: {t:g} is above 1, but --target_metric {metric!r} is an '
                       f'accuracy in [0, 1] (never reached){hint}')


def _parse_lists():
  """(algorithms, participations, targets, seeds, settings) from the list
  flags, in milliseconds and before TensorFlow loads; a bad item raises a
  ValueError naming its flag."""
  check_own_flags()
  algorithms = list(FLAGS.algorithms)
  if not algorithms:
    raise ValueError(f'--algorithms is empty; give some of '
                     f'{", ".join(sorted(registry.ALGORITHMS))}')
  if registry.unknown(algorithms, '--algorithms'):
    raise ValueError(registry.unknown(algorithms, '--algorithms'))
  reference_algorithm(algorithms)
  participations = number_list('participations', FLAGS.participations, bound='in (0, 1]',
                               example='1,0.1')
  targets = number_list('targets', FLAGS.targets, example='0.85,0.9')
  check_targets(targets, FLAGS.target_metric)
  seeds = number_list('run_seeds', FLAGS.run_seeds, integer=True, bound='>= 0',
                      example='0,1,2')
  return algorithms, participations, targets, seeds, settings()


def _parse_grid(args: trainer_flags.TrainerArgs, lists=None):
  """(algorithms, participations, targets, seeds, settings) (`lists`: those of
  `_parse_lists`, already parsed), each combination validated before any run;
  raises ValueError."""
  algorithms, participations, targets, seeds, grid = lists or _parse_lists()
  for (_, values), alg, seed in itertools.product(grid, algorithms, seeds):
    trainer_flags.validate(grid=True, args=args.override(
        **values, algorithm=alg, seed=seed, clients_per_round=1))
  return algorithms, participations, targets, seeds, grid


_BUILDS = registry.BuildCache()  # this process's builds


def _run_one(task, args: trainer_flags.TrainerArgs, out_dir: str, label: str, part: float):
  """Trains one (setting, participation, algorithm, seed); its metrics rows and
  model size in bytes."""
  from tff_algos import training  # pylint: disable=g-import-not-at-top
  _, hp, _ = trainer_flags.validate(grid=True, args=args)
  print(f'{label} p={part:g} (~{args.clients_per_round}/{len(task.client_ids)} clients) '
        f'{args.algorithm} seed {args.seed} -> {out_dir}', flush=True)
  # Seeds (and schedule points) of one algorithm share a build (`registry.BuildCache`).
  algorithm = _BUILDS.build(args.algorithm, task.model_fn,
                             algorithm_flags.config(args.algorithm, hp))
  training.run_training(algorithm, task, trainer_flags.run_config(out_dir, args),
                        extra_summary={'flags': trainer_flags.flag_values(args),
                                       'setting': label, 'participation': part},
                        identity=trainer_flags.run_identity(args))
  rows = report.read_metrics(os.path.join(out_dir, 'metrics.csv'))
  return rows, summary_file.read(os.path.join(out_dir, 'summary.json'))['model_bytes']


def _record(results, curves, rows, model_bytes, key: dict, targets):
  """Appends the run's result per target and its convergence curve; returns
  the run's metric names when it has no --target_metric column, else None."""
  from tff_algos.training import targets as metrics_tables  # pylint: disable=g-import-not-at-top
  m, metric = key['clients_per_round'], FLAGS.target_metric
  per_round = metrics_tables.models_per_round(rows, model_bytes, m)
  cum = np.cumsum(per_round)
  pts = [(c, r['round'], r[metric]) for c, r in zip(cum, rows) if metric in r]
  curves.setdefault((key['setting'], key['participation']), {}).setdefault(
      key['algorithm'], []).append(tuple(map(list, zip(*pts))) if pts else ([], [], []))
  for target in targets:
    res = metrics_tables.models_to_target(rows, target, model_bytes, m, metric)
    results.append(dict(
        key, target=target, reached=res.reached, round=res.round,
        models_transmitted=res.models_transmitted, total_models=res.total_models,
        rounds_run=res.rounds_run, final_value=res.final_value,
        models_per_round=per_round[0] if per_round else math.nan))
  return None if pts else report.metric_names(rows)


def note_missing_metric(lacking: list[tuple[str, list[str]]], runs: int, metric: str) -> None:
  """One stderr line when runs lack --target_metric (misspelt, or an eval
  metric on a task without an evaluation set): their cells read 'N+' (never
  reached), which alone did not say why. `lacking`: (run label, its metrics)."""
  if not lacking:
    return
  names = []
  for _, have in lacking:
    names += [n for n in have if n not in names]
  have = ', '.join(names) if names else 'none'
  if len(lacking) == runs:
    which, cells = 'no run has', 'every cell reads'
  else:
    shown = ', '.join(label for label, _ in lacking[:3])
    more = ', ...' if len(lacking) > 3 else ''
    which, cells = f'{len(lacking)} of {runs} runs ({shown}{more}) have no', 'their cells read'
  print(f'note: {which} metric {metric!r} (--target_metric) in metrics.csv, so {cells} '
        f'N+ (never reached); their metrics: {have}. Choose one with --target_metric: '
        'the same command tabulates the finished runs again without training them',
        file=sys.stderr)


def _write_outputs(root: str, results, curves, algorithms, reference, seeds, targets):
  table = aggregate(results, reference)
  md = markdown(table, algorithms, FLAGS.target_metric)
  title = (f'Models transmitted (relative to one round of FedAvg) until '
           f'{FLAGS.target_metric} reaches the target; "+": not reached in '
           f'{FLAGS.total_rounds} rounds; (ratio to {reference}). Task {FLAGS.task}, '
           f'seeds {",".join(map(str, seeds))}.')
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, 'tables.md'), 'w') as f:
    f.write(title + '\n\n' + md + '\n')
  with open(os.path.join(root, 'results.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(results[0]))
    writer.writeheader()
    writer.writerows(results)
  figures = []
  for (label, part), by_alg in curves.items():
    path = os.path.join(root, 'figures', f'{label}_p{part:g}.png')
    plot_setting(by_alg, path, f'{FLAGS.task} {label}, participation {part:g}',
                 FLAGS.target_metric)
    figures.append(path)
  print(title)
  print(md)
  print(f'results: {os.path.join(root, "results.csv")}  tables: '
        f'{os.path.join(root, "tables.md")}  figures: {os.path.join(root, "figures")}')
  print(json.dumps(dict(
      task=FLAGS.task, metric=FLAGS.target_metric, reference=reference,
      runs=len(results) // len(targets), figures=len(figures),
      cells={f'{s}|p{p:g}|{t:g}': {a: v['cell'] for a, v in row.items()}
             for (s, p, t), row in sorted(table.items())})))


def main(argv):
  del argv  # `common.run` refuses positional arguments
  run_dir.set_flag_names(name='--name')  # what names this grid's runs
  try:
    lists = _parse_lists()  # a bad list item is answered before TensorFlow loads
  except ValueError as e:
    return common.fail(e)
  common.quiet_logs()
  base = trainer_flags.TrainerArgs.from_flags()
  try:
    algorithms, participations, targets, seeds, grid = _parse_grid(base, lists)
  except (ValueError, flags.Error) as e:
    return common.fail(e)
  trainer_flags.warn_ignored_flags(algorithms, base)
  reference = reference_algorithm(algorithms)  # checked by `_parse_lists`

  from tasks import TaskError, get_task  # pylint: disable=g-import-not-at-top
  root = os.path.join(FLAGS.root_output_dir, FLAGS.name or f'paper003_{FLAGS.task}')
  results, curves, lacking = [], {}, []
  with runtime_flags.managed_context():
    for (label, values), seed in itertools.product(grid, seeds):
      setting = base.override(**values, seed=seed, algorithm=algorithms[0],
                              clients_per_round=1)
      options, _, _ = trainer_flags.validate(grid=True, args=setting)
      try:
        task = get_task(setting.task, options)
      except TaskError as e:  # missing dataset: one line, exit status 2
        return common.fail(e)
      n = len(task.client_ids)
      for part, alg in itertools.product(participations, algorithms):
        m = clients_per_round(part, n)
        out_dir = os.path.join(root, label, f'p{part:g}', f'{alg}_seed{seed}')
        rows, model_bytes = _run_one(
            task, setting.override(algorithm=alg, clients_per_round=m,
                                   participation_prob=part if part < 1 else None),
            out_dir, label, part)
        missing = _record(results, curves, rows, model_bytes,
                          dict(setting=label, participation=part, clients_per_round=m,
                               algorithm=alg, seed=seed), targets)
        if missing is not None:
          lacking.append((f'{label} p={part:g} {alg} seed {seed}', missing))
  _write_outputs(root, results, curves, algorithms, reference, seeds, targets)
  note_missing_metric(lacking, len(results) // len(targets), FLAGS.target_metric)
  return 0


if __name__ == '__main__':
  for _name, _value in DEFAULTS.items():
    FLAGS.set_default(_name, _value)
  common.run(main)
