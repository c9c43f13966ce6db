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

An experiment's settings are the paper's: of the trainer's flags reproduce
takes only those of `PASSED_THROUGH` (where the data lives, where results go,
progress bars, --restart, the runtime's), and refuses the others; to change a
setting, run the command `--print_commands` prints.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import time
from typing import Any, Optional

from absl import flags

from experiments.lib import common
from experiments.lib import flags as trainer_flags
from experiments import report
from experiments.lib import runtime_flags
# The runs of an experiment (also this module's API).
from experiments.lib.plans import (BINARY_CACHE_DIR, BINARY_RESTART, MODES, PASSED_THROUGH,  # pylint: disable=unused-import
                                   RunPlan, binary_argv, experiment_dir,
                                   ignored_trainer_flags, passed_through, plan_args,
                                   trainer_plans, validate_plan)
from experiments import seed_stats
from experiments.configs import base
from tff_algos.errors import UserError
# What it measures and its tables (also this module's API).
from experiments.lib.reproduce_results import (  # pylint: disable=unused-import
    _evals, accuracy_key, experiment_table, full_report, list_lines, load_results, lookup,
    markdown_lines, measure, measure_stats, run_metric)
from tff_algos.training import run_dir

flags.adopt_module_key_flags(trainer_flags)  # --help lists the flags of both
flags.adopt_module_key_flags(runtime_flags)

flags.DEFINE_bool('list', False, 'List every experiment and exit.')
flags.DEFINE_string('experiment', None, 'Experiment name (see --list).')
flags.DEFINE_enum('scale', 'smoke', ['smoke', 'full'],
                  "smoke: a few rounds on embedded/synthetic data (pipeline check); "
                  "full: the paper's setting on real data.")
flags.DEFINE_bool('report', False, 'Gather all results under --root_output_dir into report.md.')
flags.DEFINE_bool('print_commands', False, 'Print the equivalent commands and exit.')
flags.DEFINE_bool('markdown', False, 'With --list: a markdown table (docs/reproducing.md).')
FLAGS = flags.FLAGS

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
  from tff_algos.algorithms import registry
  from tff_algos.flags import algorithm_flags
  from tff_algos import training
  plans = trainer_plans(exp, scale)
  for plan in plans:  # every run's flags before any work
    validate_plan(plan)
  runs = [None] * len(plans)
  # Seeds (and runs differing only in the client schedule's numbers) share one
  # task and one build: built and traced once. A seed's runs go in a row
  # (`training.seed_major`); `runs` keeps the plans' order.
  tasks, builds = {}, registry.BuildCache()
  context = runtime_flags.managed_context() if manage_runtime else contextlib.nullcontext()
  with context:
    for index in training.seed_major(plans, lambda plan: plan.seed):
      plan = plans[index]
      options, hp, _ = validate_plan(plan)
      args = plan_args(plan)
      run_dir = os.path.join(out_dir, 'runs', plan.name)
      config = dataclasses.replace(trainer_flags.run_config(run_dir, args), progress=progress)
      key = (plan.flags['task'], options)
      if key not in tasks:
        tasks[key] = get_task(plan.flags['task'], options)
      task = tasks[key]
      algorithm = builds.build(plan.algorithm, task.model_fn,
                               algorithm_flags.config(plan.algorithm, hp))
      result = training.run_training(
          algorithm, task, config, extra_summary={'flags': trainer_flags.flag_values(args)},
          identity=trainer_flags.run_identity(args))
      rows = training.read_metrics(os.path.join(run_dir, 'metrics.csv'))
      runs[index] = dict(label=plan.label, seed=plan.seed, rows=rows,
                         summary=result.summary, dir=run_dir)
  return dict(runs=runs, rounds={p.name: p.flags['total_rounds'] for p in plans})


# The offline way of a run refused for its data (reproduce has no --use_synthetic_data).
SMOKE_INSTEAD = 'or run --scale=smoke (the embedded data: a check of the pipeline)'


def _run_binary(exp, scale, out_dir):
  """The experiment's own binary, run from the repository's root (its
  configs' data paths are relative to it) with an absolute output directory
  (a relative one landed under the root, not where reproduce was run). A
  user error of the binary (exit 2, its one `error:` line) is reproduce's
  own, said in one line."""
  argv = binary_argv(exp, scale, os.path.abspath(out_dir))
  env = dict(os.environ)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = root + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root)
  if proc.stdout or proc.returncode == 0:  # (a refused run leaves no empty file)
    with open(os.path.join(out_dir, 'stdout.txt'), 'w') as f:
      f.write(proc.stdout)
  said = proc.stderr.strip().splitlines()[-1:] or ['']
  if proc.returncode == common.USAGE_ERROR and said[0].startswith('error: '):
    from tasks.options import MissingData  # pylint: disable=g-import-not-at-top
    message = said[0][len('error: '):]
    # Said in reproduce's own flags: it has no --use_synthetic_data (its
    # offline way is --scale=smoke), and the binaries no --restart.
    if exp.runner.module not in BINARY_RESTART:
      message = message.replace(
          run_dir.RESTART_FIX,
          f'remove {out_dir} (or choose another --root_output_dir) to start the experiment '
          'over')
    if MissingData.OFFLINE in message:
      message = message.replace(MissingData.OFFLINE, SMOKE_INSTEAD)
    elif scale != 'smoke':
      message += f'; {SMOKE_INSTEAD}'
    raise UserError(f'{exp.runner.module}: {message}')
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


def _check_command_line():
  """Refuses (UserError) what the command line alone shows to be contradictory
  or ignored, before TensorFlow loads: trainer flags that no run would get,
  two modes at once, --markdown without --list."""
  ignored = ignored_trainer_flags()
  if ignored:
    taken = ', '.join(f'--{n}' for n in PASSED_THROUGH)
    raise UserError(
        f'{", ".join("--" + n for n in ignored)}: reproduce does not change an '
        "experiment's settings (they are the paper's; of the trainer's flags it takes "
        f'only {taken}); to change them, run python -m experiments.train with a command '
        'from --print_commands')
  modes = [f'--{m}' for m in MODES if FLAGS[m].value]
  if len(modes) > 1:
    raise UserError(f'{" and ".join(modes)}: give one of them (each is a mode of its own)')
  if FLAGS.markdown and not FLAGS.list:
    raise UserError('--markdown formats --list only; add --list, or drop --markdown')


def _unusable(path: str) -> Optional[OSError]:
  """Why `path` cannot be a directory (the nearest existing path at or above
  it is a file), or None; nothing is created."""
  missing = common.dirs_to_create(path)
  existing = os.path.dirname(missing[-1]) if missing else os.path.abspath(path)
  if os.path.isdir(existing):
    return None
  return OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))


def _report(root: str, shown: dict[str, base.Experiment], one: bool) -> int:
  """--report: the tables of `shown` (every experiment, or the one of
  --experiment) from the result.json files under `root`; refused when there
  is none (a mistyped or too deep --root_output_dir), nothing created."""
  error = _unusable(root)
  if error is not None:
    raise run_dir.unusable_dir(root, error, 'root_output_dir')
  results = load_results(root)
  if not any(name in results for name in shown):
    name = next(iter(shown)) if one else 'EXPERIMENT'
    layout = os.path.join(root, '{full,smoke}', name, 'result.json')
    what = f'no result of {name}' if one else 'no results'
    raise UserError(f'{what} under {root} (--report reads {layout}); give the '
                    '--root_output_dir the experiments were run with'
                    + (f', or run --experiment={name} first' if one else ''))
  common.writable_dir(root, 'root_output_dir')
  text = full_report(root, shown)
  path = os.path.join(root, f'report_{next(iter(shown))}.md' if one else 'report.md')
  with open(path, 'w') as f:
    f.write(text + '\n')
  print(text)
  print(f'report: {path}')
  return 0


def main(argv):
  del argv  # `common.run` refuses positional arguments
  # reproduce names each run's directory itself (no --experiment_name).
  run_dir.set_flag_names(name='--root_output_dir')
  _check_command_line()
  from experiments import configs
  experiments = configs.all_experiments()
  if FLAGS.experiment:  # known in every mode, not ignored by --list/--report
    try:
      exp = configs.get(FLAGS.experiment)
    except ValueError as e:
      return common.fail(f'--experiment: {e}')
  if FLAGS.list:  # with --experiment: that experiment's line only
    shown = {exp.name: exp} if FLAGS.experiment else experiments
    print('\n'.join((markdown_lines if FLAGS.markdown else list_lines)(shown)))
    return 0
  root = FLAGS.root_output_dir if FLAGS['root_output_dir'].present else 'runs/reproduce'
  progress = FLAGS.progress
  if FLAGS.report:  # with --experiment: that experiment's table only
    one = bool(FLAGS.experiment)
    return _report(root, {exp.name: exp} if one else experiments, one)
  if not FLAGS.experiment:
    return common.fail('give --experiment=NAME (see --list), --list or --report')
  out_dir = experiment_dir(root, FLAGS.scale, exp.name)
  if isinstance(exp.runner, base.Binary):
    if FLAGS.restart and exp.runner.module not in BINARY_RESTART:
      return common.fail(
          f'--restart: {exp.name} is run by {exp.runner.module}, which has no --restart; '
          f'remove {out_dir} (or choose another --root_output_dir) to start it over')
    if FLAGS.cache_dir and exp.runner.module not in BINARY_CACHE_DIR:
      run_dir.notice(f'--cache_dir is not used: {exp.runner.module} reads no TFF dataset')
    if FLAGS['progress'].present:
      run_dir.notice(f'--progress is not used: {exp.runner.module} runs with its output '
                     'captured (no progress bars)')
  try:
    if isinstance(exp.runner, base.TrainerRuns):
      plans = trainer_plans(exp, FLAGS.scale)
      for plan in plans:
        validate_plan(plan)
  except ValueError as e:
    return common.fail(e)
  if FLAGS.print_commands:
    if isinstance(exp.runner, base.Binary):
      print(' '.join(binary_argv(exp, FLAGS.scale, out_dir)[1:]).replace('-m ', 'python -m ', 1))
    else:
      passed = passed_through()
      for plan in plans:
        print(plan.command(os.path.join(out_dir, 'runs'), passed))
    return 0
  created = common.dirs_to_create(out_dir)
  common.writable_dir(out_dir, 'root_output_dir')
  common.quiet_logs()
  print(f'{exp.name}: {exp.paper}, {exp.ref} [{FLAGS.scale}] -> {out_dir}', flush=True)
  try:
    result = run_experiment(exp, FLAGS.scale, root, progress=progress)
  except Exception as e:  # data missing at full scale, a binary failing, ...
    from tasks import MissingData, TaskError  # pylint: disable=g-import-not-at-top
    if not isinstance(e, (TaskError, ValueError, UserError)):  # (MissingData: a TaskError)
      raise
    common.remove_empty(created)  # a refused run leaves no empty directories behind
    if isinstance(e, MissingData):
      # reproduce has no --use_synthetic_data: its offline check is --scale=smoke.
      return common.fail(e.offline_instead(SMOKE_INSTEAD))
    return common.fail(e)
  print(result['table'])
  print(f'result: {os.path.join(out_dir, "result.json")}  plot: {result["plot"]}')
  return 0


if __name__ == '__main__':
  common.run(main)
