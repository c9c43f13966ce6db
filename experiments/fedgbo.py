r"""Paper 004 (FedGBO) comparison: Tables IV/V-style results and cost curves.

    python -m experiments.fedgbo --tasks=femnist,cifar100,shakespeare --ks=10,50 \
        --cache_dir=~/.tff --total_rounds=5000 --rounds_per_eval=50 \
        --client_learning_rate=0.1 --algorithm_flags='fedmax:fedmax_beta=1'
    python -m experiments.fedgbo --tasks=sent140 --sent140_dir=leaf/data/sent140/data
    python -m experiments.fedgbo --tasks=digits --ks=2 --total_rounds=4   # offline smoke

For every task x K x algorithm one run of the trainer (resumable, in
<root_output_dir>/<grid_name>/<task>/K<k>/<algorithm>/), then per (task, K)
Table IV: each algorithm's maximum test accuracy, the upload (GB) and client
FLOPs to reach it, and the rounds, upload and FLOPs to reach FedAvg's maximum;
Table V: the maximum accuracy of fedgbo, mimelite, mimexlite per (task, K,
client optimiser). Costs come from metrics.csv (`tff_algos.training.loop`: bytes
from the TFF types, FLOPs measured on the model's graph). Writes tables.md,
table4.csv, and accuracy-vs-upload / accuracy-vs-FLOPs plots; the last line
printed is a JSON summary.

Task presets (paper 004 Section 5; overridable by the trainer flags
--model/--num_clients/--clients_per_round/--client_batch_size when set
explicitly): femnist = emnist_character, femnist_cnn, 3000 clients, M = 30,
B = 32; cifar100 = cifar100_image, cnn004 (500 clients), M = 5, B = 32;
shakespeare = shakespeare_character, gru128 (2 x GRU 128), 660 clients, M = 7,
B = 32; sent140 = LEAF Sent140 from --sent140_dir (5k bag of words, linear
model), M = 22, B = 8; digits = the embedded offline task (smoke runs).
The trainer flags this binary sets for every run are refused when given:
--task (use --tasks), --algorithm (--algorithms), --local_steps (--ks),
--experiment_name (--grid_name).
Algorithms: fedavg (AdaptiveFedOpt with --server_optimizer), fedgbo, mfl,
mimelite, mimexlite (their client optimiser defaults to SGDm, beta 0.9: the
setting of Table IV), fedmax, fedprox; all run K local steps and the plain
client mean 1/M of Algorithm 1 (--nouniform_weighting: weights n_i).
`--algorithm_flags` sets per-algorithm flags of algorithms in --algorithms, e.g.
'fedgbo:client_optimizer=adam,client_beta_1=0.9;fedprox:prox_mu=0.01'. The
tables use --select_metric, or where the runs lack it (left unset) the task's
accuracy column; a note on stderr says when a table uses another column.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import os
import sys

from absl import flags
import numpy as np

from experiments import report
from experiments.lib import common
from experiments.lib import flags as trainer_flags
from experiments.lib import runtime_flags
from tff_algos.training import run_dir

flags.adopt_module_key_flags(trainer_flags)  # --help lists the flags of both
flags.adopt_module_key_flags(runtime_flags)

flags.DEFINE_list('tasks', ['femnist', 'cifar100', 'shakespeare'],
                  'Task presets: femnist, cifar100, shakespeare, sent140, digits.')
flags.DEFINE_list('algorithms', ['fedavg', 'fedgbo', 'mfl', 'mimelite', 'mimexlite',
                                 'fedmax', 'fedprox'], 'Algorithms (registry names).')
flags.DEFINE_list('ks', ['10', '50'], 'Local steps K per round.')
flags.DEFINE_string('algorithm_flags', '', "Per-algorithm flags: 'alg:flag=v,flag=v;alg2:...'.")
flags.DEFINE_string('sent140_dir', None, 'LEAF Sent140 data directory holding train/*.json '
                    'and test/*.json (LEAF preprocess.sh -s niid --sf 1.0 -k 10 -t sample).')
flags.DEFINE_string('grid_name', 'fedgbo', 'Directory under --root_output_dir.')
flags.DEFINE_string('select_metric', 'eval/sparse_categorical_accuracy',
                    'metrics.csv accuracy column of the tables.')
FLAGS = flags.FLAGS

# Paper 004 Section 5 (Table 3).
PRESETS = {
    'femnist': dict(task='emnist_character', model='femnist_cnn', num_clients=3000,
                    clients_per_round=30, client_batch_size=32),
    'cifar100': dict(task='cifar100_image', model='cnn004', clients_per_round=5,
                     client_batch_size=32),
    'shakespeare': dict(task='shakespeare_character', model='gru128', num_clients=660,
                        clients_per_round=7, client_batch_size=32),
    'sent140': dict(task='digits', clients_per_round=22, client_batch_size=8),  # data: own loader
    'digits': dict(task='digits', model='mlp', clients_per_round=5, client_batch_size=32),
}
# Algorithm 1 (and the authors' code, for every method) averages clients 1/M.
COMMON_DEFAULTS = dict(uniform_weighting='true')
# Table IV's adaptive-FL algorithms use SGDm on clients.
ALGORITHM_DEFAULTS = {name: dict(client_optimizer='sgdm', client_momentum='0.9')
                      for name in ('fedgbo', 'mfl', 'mimelite', 'mimexlite')}
TABLE5 = ('fedgbo', 'mimelite', 'mimexlite')


# Trainer flags that this binary sets itself for every run, and the flag of its
# own that gives them: given on the command line they were ignored.
OWN_FLAGS = dict(experiment_name='--grid_name', algorithm='--algorithms', task='--tasks',
                 local_steps='--ks')


def parse_algorithm_flags(spec: str, algorithms=None) -> dict[str, dict[str, str]]:
  """{algorithm: {trainer flag: value as written}} of --algorithm_flags; an
  algorithm not among `algorithms` (when given: --algorithms) is refused (its
  flags were ignored), and so is a flag that is not the trainer's or that this
  binary sets per run (`OWN_FLAGS`)."""
  trainer = {f.name for f in FLAGS.get_flags_for_module(trainer_flags)}
  out: dict[str, dict[str, str]] = {}
  for part in filter(None, (p.strip() for p in spec.split(';'))):
    if ':' not in part:
      raise ValueError(f'--algorithm_flags part {part!r} is not alg:flag=v,...')
    name, assigns = part.split(':', 1)
    name = name.strip()
    if algorithms is not None and name not in algorithms:
      raise ValueError(f'--algorithm_flags names {name!r}, which is not one of --algorithms '
                       f'({", ".join(algorithms)}); add it to --algorithms or drop its '
                       'flags')
    for assign in filter(None, (a.strip() for a in assigns.split(','))):
      if '=' not in assign:
        raise ValueError(f'--algorithm_flags: {assign!r} is not flag=value')
      key, value = (s.strip() for s in assign.split('=', 1))
      if key not in trainer:
        raise ValueError(f'--algorithm_flags: unknown flag {key!r}; per-algorithm flags are '
                         'trainer flags, e.g. client_learning_rate')
      if key in OWN_FLAGS and key != 'local_steps':  # a per-algorithm K is honoured
        raise ValueError(f'--algorithm_flags: {key!r} is set by this binary for each run; '
                         f'use {OWN_FLAGS[key]}')
      try:
        FLAGS[key].parser.parse(value)
      except (ValueError, flags.Error) as e:
        raise ValueError(f'--algorithm_flags: {name}:{key}={value}: {e}; give a value that '
                         f'--{key} takes') from None
      out.setdefault(name, {})[key] = value
  return out


# -------------------------------------------------------------------- runs


def _validate(preset: str, args):
  """`flags.validate` of one run. Sent140's --task=digits only stands in for
  its own loader: digits' client count does not cap its cohort."""
  return trainer_flags.validate(grid=True, args=args, check_cohort=preset != 'sent140')


def _settings(preset: str, k: str, algorithm: str, overrides,
              explicit: set[str]) -> dict[str, str]:
  """Flag values of one run: preset, K, algorithm defaults, user overrides
  (flags given on the command line, `explicit`, beat presets and defaults)."""
  values = {key: str(v) for key, v in PRESETS[preset].items()
            if key not in explicit and not (FLAGS.use_synthetic_data and key == 'num_clients')}
  values.update(local_steps=k, algorithm=algorithm)
  for key, v in {**COMMON_DEFAULTS, **ALGORITHM_DEFAULTS.get(algorithm, {})}.items():
    if key not in explicit:
      values[key] = v
  values.update(overrides.get(algorithm, {}))
  return values


def _run_args(base: trainer_flags.TrainerArgs, values: dict) -> trainer_flags.TrainerArgs:
  """`base` with one run's flag values (strings, parsed as the flags parse them)."""
  return base.override(**{name: FLAGS[name].parser.parse(value) if isinstance(value, str)
                          else value for name, value in values.items()})


def plot_costs(runs: dict, metric: str, path: str, title: str) -> str:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for name, rows in runs.items():
    pts = [(r.get('cum_upload_bytes', np.nan) / 1e9, r.get('cum_client_flops', np.nan) / 1e12,
            r[metric]) for r in rows if metric in r]
    if pts:
      up, fl, acc = zip(*pts)
      axes[0].plot(up, acc, 'o-', ms=3, label=name)
      axes[1].plot(fl, acc, 'o-', ms=3, label=name)
  axes[0].set_xlabel('upload (GB)'); axes[1].set_xlabel('client FLOPs (x1e12)')
  for ax in axes:
    ax.set_ylabel(metric.split('/')[-1])
  axes[1].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def accuracy_column(runs: dict, preferred: str) -> str:
  """`preferred` if the runs have it, else their first eval accuracy column
  (e.g. Shakespeare's masked 'eval/accuracy')."""
  names = metric_names(runs)
  if preferred in names:
    return preferred
  return next((n for n in names if 'accuracy' in n), preferred)


def metric_names(runs: dict) -> list[str]:
  """The eval metrics of `runs` (algorithm -> metrics.csv rows), in order."""
  names = []
  for rows in runs.values():
    names += [n for n in report.eval_metric_names(rows) if n not in names]
  return names


def note_select_metric(used: list[tuple[str, str, list[str]]], metric: str,
                       given: bool) -> None:
  """One stderr line when tables are not of --select_metric. `used`: (table,
  the column it used, its runs' eval metrics) per table. Said for a table
  whose column is in none of its runs (its accuracies are nan) and, when
  --select_metric was given on the command line, for one that fell back to
  another accuracy column (left unset, the default falls back to the task's
  own accuracy, e.g. Shakespeare's 'eval/accuracy', as documented)."""
  other = [(t, col, names) for t, col, names in used
           if col not in names or (given and col != metric)]
  if not other:
    return
  tables = ', '.join(t for t, _, _ in other[:3]) + (', ...' if len(other) > 3 else '')
  cols, have = [], []
  for _, col, names in other:
    if col in names and col not in cols:
      cols.append(col)
    have += [n for n in names if n not in have]
  if cols:
    instead = f'use {" / ".join(map(repr, cols))} instead'
    if any(col not in names for _, col, names in other):
      instead += ' (nan where they have no accuracy column)'
  else:
    instead = 'are nan'
  print(f'note: the runs of {tables} have no metric {metric!r} (--select_metric) in '
        f'metrics.csv, so their tables {instead}; their eval metrics: '
        f'{", ".join(have) or "none"}. Choose one with --select_metric: the same command '
        'tabulates the finished runs again without training them', file=sys.stderr)


def check_lists() -> None:
  """--tasks, --algorithms and --ks, each bad item named with its flag, the
  trainer flags this binary sets itself (`OWN_FLAGS`: refused when given) and
  --grid_name (one directory name under --root_output_dir), in milliseconds:
  before TensorFlow loads (the registry imports none)."""
  from tff_algos.algorithms import registry  # pylint: disable=g-import-not-at-top
  for name, instead in OWN_FLAGS.items():
    if FLAGS[name].present:
      raise ValueError(f'--{name} is not read by this binary (it sets it for each run); '
                       f'use {instead}')
  trainer_flags.check_dir_name('grid_name', FLAGS.grid_name)
  for name in FLAGS.tasks:
    if name not in PRESETS:
      raise ValueError(f'--tasks: unknown task preset {name!r}; choose from '
                       f'{", ".join(PRESETS)}')
  if registry.unknown(FLAGS.algorithms, '--algorithms'):
    raise ValueError(registry.unknown(FLAGS.algorithms, '--algorithms'))
  for k in FLAGS.ks:
    if not k.isdigit() or int(k) < 1:
      raise ValueError(f'--ks must be positive integers, got {k!r}')


def main(argv):
  del argv
  run_dir.set_flag_names(name='--grid_name')  # what names this grid's runs
  base = trainer_flags.TrainerArgs.from_flags()
  explicit = {name for name in FLAGS if FLAGS[name].present}
  try:  # the flags alone, before TensorFlow loads
    check_lists()
    overrides = parse_algorithm_flags(FLAGS.algorithm_flags, FLAGS.algorithms)
    combos = [(t, k, a) for t in FLAGS.tasks for k in FLAGS.ks for a in FLAGS.algorithms]
    runs = [_run_args(base, _settings(*combo, overrides, explicit)) for combo in combos]
    for (preset, _, _), args in zip(combos, runs):
      _validate(preset, args)
  except (ValueError, flags.Error) as e:
    return common.fail(e)
  common.quiet_logs()
  from tasks import sent140  # pylint: disable=g-import-not-at-top
  from tff_algos.algorithms import registry  # pylint: disable=g-import-not-at-top
  from tff_algos.flags import algorithm_flags  # pylint: disable=g-import-not-at-top
  try:
    if 'sent140' in FLAGS.tasks:
      sent140.files(FLAGS.sent140_dir)
    for (preset, _, _), args in zip(combos, runs):  # validate every run before starting any
      _validate(preset, args)
  except (ValueError, flags.Error) as e:
    return common.fail(e)
  trainer_flags.warn_ignored_flags(FLAGS.algorithms, base)

  from tasks import get_task
  from tff_algos import training
  root = common.writable_dir(os.path.join(FLAGS.root_output_dir, FLAGS.grid_name),
                             'root_output_dir')
  results = collections.defaultdict(dict)   # (task, K) -> algorithm -> rows
  optimisers = {}
  tasks_cache = {}
  builds = registry.BuildCache()  # runs differing only in K (or eta) share a build
  with runtime_flags.managed_context():
    for i, ((preset, k, name), args) in enumerate(zip(combos, runs)):
      options, hp, _ = _validate(preset, args)
      key = (preset, options)
      if key not in tasks_cache:
        tasks_cache[key] = (sent140.build(FLAGS.sent140_dir, args.client_batch_size)
                            if preset == 'sent140' else get_task(args.task, options))
      task = tasks_cache[key]
      config = trainer_flags.run_config(os.path.join(root, preset, f'K{k}', name), args)
      if config.clients_per_round > len(task.client_ids):  # synthetic stand-ins are tiny
        config = dataclasses.replace(config, clients_per_round=len(task.client_ids))
      print(f'[{i + 1}/{len(combos)}] {preset} K={k} {name}', flush=True)
      algorithm = builds.build(name, task.model_fn, algorithm_flags.config(name, hp))
      training.run_training(algorithm, task, config,
                            extra_summary={'flags': trainer_flags.flag_values(args)},
                            identity=dict(trainer_flags.run_identity(args), preset=preset))
      results[(preset, k)][name] = report.read_metrics(
          os.path.join(config.output_dir, 'metrics.csv'))
      optimisers[(preset, k, name)] = args.client_optimizer

  md, csv_rows, summary, table5, used = [], [], {}, [], []
  for (preset, k), runs in results.items():
    metric = accuracy_column(runs, FLAGS.select_metric)
    used.append((f'{preset} K={k}', metric, metric_names(runs)))
    header, table = report.cost_table(runs, metric)
    title = f'{preset}, K = {k} ({metric})'
    md += [f'## Table IV: {title}', '', report.markdown_table(header, table), '']
    print(title)
    print(report.format_table(header, table, floatfmt='.4g'))
    csv_rows += [dict(zip(['task', 'K'] + header, [preset, k] + row)) for row in table]
    summary[f'{preset}/K{k}'] = {row[0]: row[1] if np.isfinite(row[1]) else None
                                 for row in table}
    plot_costs(runs, metric, os.path.join(root, f'{preset}_K{k}_costs.png'), title)
    table5 += [[preset, k, optimisers[(preset, k, a)], a,
                100 * report.best_metric(runs[a], metric)[0]] for a in TABLE5 if a in runs]
  if table5:
    md += ['## Table V: maximum accuracy (%)', '', report.markdown_table(
        ['task', 'K', 'client_optimizer', 'algorithm', 'max_acc_%'], table5), '']
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, 'tables.md'), 'w') as f:
    f.write('\n'.join(md))
  with open(os.path.join(root, 'table4.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=['task', 'K'] + header)
    writer.writeheader()
    writer.writerows(csv_rows)
  print(f'tables: {os.path.join(root, "tables.md")}')
  note_select_metric(used, FLAGS.select_metric, FLAGS['select_metric'].present)
  print(json.dumps({'max_accuracy_%': summary, 'output_dir': root}))
  return 0


if __name__ == '__main__':
  common.run(main)
