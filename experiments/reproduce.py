r"""Reproduce a published table or figure, and compare with the published numbers.

    python -m experiments.reproduce --list
    python -m experiments.reproduce --experiment=fedopt_baselines_emnist_cr_fedavg --scale=smoke
    python -m experiments.reproduce --experiment=fedopt_baselines_emnist_cr_fedavg --scale=full \
        --cache_dir=~/.tff                        # the paper's setting; resumable
    python -m experiments.reproduce --report      # every result under --root_output_dir

An experiment (`experiments/configs/`) is a set of trainer runs or one call of
a dedicated binary, plus the published numbers. Each trainer run is exactly a
`python -m experiments.train` command line (printed with `--print_commands`):
its flags go through the trainer's own validation, and its output directory is
resumable like the trainer's. Results go to
<root_output_dir>/<scale>/<experiment>/: result.json (measured values by key),
table.md (published vs measured) and plot.png. `--report` gathers them into
one side-by-side table, report.md, marking values not run at full scale.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags

from experiments import common
from experiments import flags as trainer_flags
from experiments import report
from experiments import runtime_flags
from experiments import seed_stats
from experiments.configs import base

flags.adopt_module_key_flags(trainer_flags)  # --help lists the flags of both
flags.adopt_module_key_flags(runtime_flags)

flags.DEFINE_bool('list', False, 'List every experiment and exit.')
flags.DEFINE_string('experiment', None, 'Experiment name (see --list).')
flags.DEFINE_enum('scale', 'smoke', ['smoke', 'full'],
                  "smoke: a few rounds on embedded/synthetic data (pipeline check); "
                  "full: the paper's setting on real data.")
flags.DEFINE_bool('report', False, 'Gather all results under --root_output_dir into report.md.')
flags.DEFINE_bool('print_commands', False, 'Print the equivalent commands and exit.')
flags.DEFINE_bool('markdown', False, 'With --list: a markdown table (the README section).')
FLAGS = flags.FLAGS

# Flags of the trainer that describe the data (dropped at smoke scale, where
# the experiment's smoke task and its own flags replace them).
TASK_FLAGS = ('task', 'model', 'cache_dir', 'use_synthetic_data', 'num_clients',
              'dirichlet_alpha', 'partition', 'libsvm_path', 'l2_reg', 'unbalanced_sigma',
              'synthetic_heterogeneity', 'max_eval_examples', 'max_client_examples',
              'test_examples', 'max_elements_per_user')
# Trainer flags a config may not set (the runner owns them).
RUNNER_FLAGS = ('root_output_dir', 'experiment_name', 'total_rounds', 'clients_per_round',
                'seed', 'rounds_per_eval', 'progress')
# How each dedicated binary names its output directory flag.
BINARY_OUTPUT_FLAG = {'experiments.local_update_decay': 'root_output_dir'}
SMOKE_MAX_LOCAL_STEPS = 5
# Trainer flags given on reproduce's own command line that apply to every run
# (where the data lives, where results go, progress bars).
PASSED_THROUGH = ('cache_dir', 'root_output_dir', 'progress', 'backend', 'workers',
                  'concurrent_clients')
_USER_VALUES: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class RunPlan:
  label: str
  seed: int
  algorithm: str
  flags: dict[str, Any]    # every trainer flag that differs from its default

  @property
  def name(self) -> str:
    return f'{self.label}_seed{self.seed}'

  def command(self, out_root: str) -> str:
    args = [f'--{k}={_flag_str(v)}' for k, v in self.flags.items()]
    return ' '.join(['python -m experiments.train', *args, f'--root_output_dir={out_root}',
                     f'--experiment_name={self.name}'])


def _flag_str(value) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return ','.join(str(v) for v in value)
  return str(value)


def experiment_dir(root: str, scale: str, name: str) -> str:
  return os.path.join(root, scale, name)


# ----------------------------------------------------------------------------
# Plans.

def trainer_plans(exp: base.Experiment, scale: str) -> list[RunPlan]:
  """The trainer runs of `exp` at `scale` (flags as the trainer takes them)."""
  spec = exp.runner
  assert isinstance(spec, base.TrainerRuns)
  smoke = scale == 'smoke'
  plans = []
  for run in spec.runs:
    for key in list(spec.common_flags) + list(run.flags) + list(spec.task_flags):
      if key in RUNNER_FLAGS or key == 'algorithm':
        raise ValueError(f'{exp.name}/{run.label}: flag --{key} is set by the runner, '
                         'not by a config')
    merged = dict(spec.common_flags)
    merged.update(run.flags)
    if smoke:
      merged = {k: v for k, v in merged.items() if k not in TASK_FLAGS}
      merged.update(task=spec.smoke_task, **spec.smoke_task_flags)
      if merged.get('local_steps'):
        merged['local_steps'] = min(merged['local_steps'], SMOKE_MAX_LOCAL_STEPS)
      if merged.get('client_epochs_per_round', 1) > 1:
        merged['client_epochs_per_round'] = 1
    else:
      merged.update(task=spec.task, **spec.task_flags)
    merged.update(
        algorithm=run.algorithm,
        total_rounds=spec.smoke_rounds if smoke else spec.total_rounds,
        clients_per_round=(min(spec.smoke_clients_per_round, spec.clients_per_round)
                           if smoke else spec.clients_per_round),
        rounds_per_eval=1 if smoke else spec.rounds_per_eval)
    for seed in (spec.seeds[:1] if smoke else spec.seeds):
      plans.append(RunPlan(run.label, seed, run.algorithm, dict(merged, seed=seed)))
  return plans


def binary_argv(exp: base.Experiment, scale: str, out_dir: str) -> list[str]:
  spec = exp.runner
  assert isinstance(spec, base.Binary)
  values = dict(spec.smoke_flags if scale == 'smoke' else spec.flags)
  values[BINARY_OUTPUT_FLAG.get(spec.module, 'output_dir')] = out_dir
  values.setdefault('progress', False)
  values.setdefault('backend', runtime_flags.backend())  # every binary has --backend
  if runtime_flags.workers():
    values.setdefault('workers', runtime_flags.workers())
  if runtime_flags.concurrent_clients() is not None:
    values.setdefault('concurrent_clients', runtime_flags.concurrent_clients())
  return [sys.executable, '-m', spec.module] + [
      f'--{k}={_flag_str(v)}' for k, v in values.items()]


def _set_trainer_flags(values: dict[str, Any]) -> None:
  """Sets the trainer's flags to their defaults overridden by `values`."""
  names = {f.name for f in FLAGS.get_flags_for_module(trainer_flags.__name__)}
  unknown = sorted(set(values) - names)
  if unknown:
    raise ValueError(f'not trainer flags: {", ".join(unknown)} '
                     '(see python -m experiments.train --helpfull)')
  if not FLAGS.is_parsed():  # used as a library (tests): defaults stand in for argv
    FLAGS.mark_as_parsed()
  if not _USER_VALUES:  # what reproduce's own command line gave, kept for every run
    _USER_VALUES.update({n: FLAGS[n].value for n in PASSED_THROUGH})
  for name in names:
    FLAGS[name].value = _USER_VALUES.get(name, FLAGS[name].default)
  for name, value in values.items():
    if value is None:
      FLAGS[name].value = None
    else:
      FLAGS[name].parse(value if isinstance(value, str) else _flag_str(value))


def validate_plan(plan: RunPlan):
  """Trainer validation of one run (cheap; raises ValueError)."""
  _set_trainer_flags(plan.flags)
  try:
    return trainer_flags.validate()
  except trainer_flags.FlagError as e:
    raise ValueError(f'{plan.name}: {e}') from None


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
      from tff_algos import metrics_tables  # pylint: disable=g-import-not-at-top
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
# Running.

def run_experiment(exp: base.Experiment, scale: str, root: str, progress: bool = False,
                   manage_runtime: bool = True) -> dict[str, Any]:
  """Runs (or resumes) `exp` at `scale`; writes result.json, table.md, plot.png.

  `manage_runtime=False` uses the TFF context already installed (tests).
  """
  out_dir = experiment_dir(root, scale, exp.name)
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  if isinstance(exp.runner, base.TrainerRuns):
    results = _run_trainer(exp, scale, out_dir, progress, manage_runtime)
  else:
    results = _run_binary(exp, scale, out_dir)
  stats = measure_stats(exp, results)
  result = dict(experiment=exp.name, paper=exp.paper, ref=exp.ref, scale=scale,
                wall_time_s=time.perf_counter() - t0,
                measured={k: v['mean'] for k, v in stats.items()}, stats=stats,
                rounds=results.get('rounds'),
                published={p.key: p.value for p in exp.published})
  with open(os.path.join(out_dir, 'result.json'), 'w') as f:
    json.dump(result, f, indent=2)
  table = experiment_table(exp, {scale: result})
  with open(os.path.join(out_dir, 'table.md'), 'w') as f:
    f.write(f'# {exp.name}: {exp.paper}, {exp.ref} ({scale} scale)\n\n{table}\n')
  result['table'] = table
  result['plot'] = _plot(exp, results, out_dir)
  return result


def _run_trainer(exp, scale, out_dir, progress, manage_runtime):
  import contextlib
  from tasks import get_task
  from tff_algos import registry, training
  plans = trainer_plans(exp, scale)
  for plan in plans:  # every run's flags before any work
    validate_plan(plan)
  runs = []
  context = runtime_flags.managed_context() if manage_runtime else contextlib.nullcontext()
  with context:
    for plan in plans:
      options, hp, _ = validate_plan(plan)
      run_dir = os.path.join(out_dir, 'runs', plan.name)
      config = dataclasses.replace(trainer_flags.run_config(run_dir), progress=progress)
      task = get_task(plan.flags['task'], options)
      algorithm = registry.build(plan.algorithm, task.model_fn, hp)
      result = training.run_training(
          algorithm, task, config, extra_summary={'flags': trainer_flags.flag_values()},
          identity=trainer_flags.run_identity())
      rows = training.read_metrics(os.path.join(run_dir, 'metrics.csv'))
      runs.append(dict(label=plan.label, seed=plan.seed, rows=rows,
                       summary=result.summary, dir=run_dir))
  return dict(runs=runs, rounds={p.name: p.flags['total_rounds'] for p in plans})


def _run_binary(exp, scale, out_dir):
  argv = binary_argv(exp, scale, out_dir)
  env = dict(os.environ)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = root + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root)
  with open(os.path.join(out_dir, 'stdout.txt'), 'w') as f:
    f.write(proc.stdout)
  if proc.returncode != 0:
    raise RuntimeError(f'{" ".join(argv)} failed (exit {proc.returncode}):\n'
                       f'{proc.stderr[-3000:]}')
  lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
  try:
    payload = json.loads(lines[-1])
  except (IndexError, json.JSONDecodeError):
    raise RuntimeError(f'{exp.runner.module} did not end with a JSON line') from None
  return dict(json=payload, rounds={'binary': lookup(payload, 'rounds')})


def _plot(exp, results, out_dir) -> Optional[str]:
  path = os.path.join(out_dir, 'plot.png')
  if isinstance(exp.runner, base.Binary):
    pngs = sorted(os.path.join(d, f) for d, _, fs in os.walk(out_dir) for f in fs
                  if f.endswith('.png') and f != 'plot.png')
    if not pngs:
      return None
    shutil.copyfile(pngs[0], path)
    return path
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  labels = list(dict.fromkeys(r['label'] for r in results['runs']))
  for label in labels:
    runs = [r for r in results['runs'] if r['label'] == label]
    curves = [_evals(r['rows'], accuracy_key(r['rows'])) for r in runs
              if accuracy_key(r['rows'])]
    if not curves or not all(curves):
      continue
    rounds = [rv[0] for rv in seed_stats.mean_curve(curves)]
    by_seed = [dict(c) for c in curves]
    points = [seed_stats.summarize([d[r] for d in by_seed]) for r in rounds]
    line, = ax.plot(rounds, [p['mean'] for p in points],
                    label=f'{label} ({len(curves)} seeds)' if len(curves) > 1 else label)
    if len(curves) > 1:
      ax.fill_between(rounds, [p['ci95'][0] for p in points],
                      [p['ci95'][1] for p in points], color=line.get_color(), alpha=0.2)
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy (mean over seeds, band: 95 % CI)')
  ax.set_title(f'{exp.name} ({exp.ref})', fontsize=9)
  if ax.lines:
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


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
    rows.append([exp.name, pub.ref, pub.label or pub.key, value, _fmt(measured),
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  from experiments import configs
  experiments = configs.all_experiments()
  if FLAGS.list:
    print('\n'.join((markdown_lines if FLAGS.markdown else list_lines)(experiments)))
    return 0
  root = FLAGS.root_output_dir if FLAGS['root_output_dir'].present else 'runs/reproduce'
  progress = FLAGS.progress
  if FLAGS.report:
    text = full_report(root, experiments)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, 'report.md'), 'w') as f:
      f.write(text + '\n')
    print(text)
    print(f'report: {os.path.join(root, "report.md")}')
    return 0
  if not FLAGS.experiment:
    return common.fail('give --experiment=NAME (see --list), --list or --report')
  try:
    exp = configs.get(FLAGS.experiment)
    if isinstance(exp.runner, base.TrainerRuns):
      plans = trainer_plans(exp, FLAGS.scale)
      for plan in plans:
        validate_plan(plan)
  except ValueError as e:
    return common.fail(e)
  out_dir = experiment_dir(root, FLAGS.scale, exp.name)
  if FLAGS.print_commands:
    if isinstance(exp.runner, base.Binary):
      print(' '.join(binary_argv(exp, FLAGS.scale, out_dir)[1:]).replace('-m ', 'python -m ', 1))
    else:
      for plan in plans:
        print(plan.command(os.path.join(out_dir, 'runs')))
    return 0
  common.quiet_logs()
  print(f'{exp.name}: {exp.paper}, {exp.ref} [{FLAGS.scale}] -> {out_dir}', flush=True)
  try:
    result = run_experiment(exp, FLAGS.scale, root, progress=progress)
  except Exception as e:  # data missing at full scale, a binary failing, ...
    from tasks.base import TaskError
    if isinstance(e, (TaskError, ValueError)):
      return common.fail(e)
    raise
  print(result['table'])
  print(f'result: {os.path.join(out_dir, "result.json")}  plot: {result["plot"]}')
  return 0


if __name__ == '__main__':
  common.run(main)
