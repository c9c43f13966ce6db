"""A reproduction's runs: the trainer runs of an experiment at a scale
(`trainer_plans`, each a `RunPlan` of trainer flags), a dedicated binary's
command line (`binary_argv`), and the flags that reproduce passes on to every
run or refuses."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Optional

from absl import flags

from experiments.configs import base
from experiments.lib import flags as trainer_flags
from experiments.lib import runtime_flags

FLAGS = flags.FLAGS

# Flags of the trainer that describe the data (dropped at smoke scale, where
# the experiment's smoke task and its own flags replace them; token_weighting:
# the trainer refuses it on a task without token sequences, as the smoke's).
TASK_FLAGS = ('task', 'model', 'cache_dir', 'use_synthetic_data', 'num_clients',
              'dirichlet_alpha', 'partition', 'libsvm_path', 'l2_reg', 'unbalanced_sigma',
              'synthetic_heterogeneity', 'max_eval_examples', 'max_client_examples',
              'test_examples', 'max_elements_per_user', 'token_weighting')
# Trainer flags a config may not set (the runner owns them).
RUNNER_FLAGS = ('root_output_dir', 'experiment_name', 'total_rounds', 'clients_per_round',
                'seed', 'rounds_per_eval', 'progress')
# How each dedicated binary names its output directory flag.
BINARY_OUTPUT_FLAG = {'experiments.local_update_decay': 'root_output_dir'}
# The dedicated binaries that read TFF datasets from --cache_dir (reproduce's
# --cache_dir is passed on to them).
BINARY_CACHE_DIR = ('experiments.local_update_decay',)
# ... and those with a --restart of their own (reproduce's --restart passes to them).
BINARY_RESTART = ('experiments.local_update_decay',)
SMOKE_MAX_LOCAL_STEPS = 5
# Trainer flags given on reproduce's own command line that apply to every run
# (where the data lives, where results go, progress bars, starting the runs
# over, how TFF runs). Every other trainer flag given to reproduce is refused
# (`ignored_trainer_flags`): an experiment's settings are the paper's.
PASSED_THROUGH = ('cache_dir', 'root_output_dir', 'progress', 'restart', 'backend', 'workers',
                  'concurrent_clients', 'compile_local_loop')
# reproduce's modes: one at a time.
MODES = ('list', 'report', 'print_commands')


@dataclasses.dataclass(frozen=True)
class RunPlan:
  label: str
  seed: int
  algorithm: str
  flags: dict[str, Any]    # every trainer flag that differs from its default

  @property
  def name(self) -> str:
    return f'{self.label}_seed{self.seed}'

  def command(self, out_root: str, passed: Optional[dict[str, Any]] = None) -> str:
    """The run as a trainer command line; `passed`: the values reproduce passes
    on to every run (`passed_through()`), given first (a plan's own flag wins,
    as in `plan_args`)."""
    args = [f'--{k}={flag_str(v)}' for k, v in {**(passed or {}), **self.flags}.items()]
    return ' '.join(['python -m experiments.train', *args, f'--root_output_dir={out_root}',
                     f'--experiment_name={self.name}'])


def flag_str(value) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return ','.join(str(v) for v in value)
  return str(value)


def experiment_dir(root: str, scale: str, name: str) -> str:
  return os.path.join(root, scale, name)


def ignored_trainer_flags() -> list[str]:
  """The trainer's flags given on reproduce's command line that no run would
  get (all but `PASSED_THROUGH`): refused, not silently dropped."""
  return sorted(f.name for f in FLAGS.get_flags_for_module(trainer_flags.__name__)
                if f.present and f.name not in PASSED_THROUGH)


def passed_through() -> dict[str, Any]:
  """The values of `PASSED_THROUGH` that reproduce gives every trainer run
  (its --root_output_dir aside: each run has its own), those that differ from
  the trainer's defaults: what a printed command must repeat to be the run."""
  values = {}
  for name in PASSED_THROUGH:
    flag = FLAGS[name]
    if name != 'root_output_dir' and flag.value is not None and flag.value != flag.default:
      values[name] = flag.value
  return values


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
  cache_dir = FLAGS['cache_dir'].value
  if cache_dir and spec.module in BINARY_CACHE_DIR:
    # Absolute: the binary runs from the repository's root (`_run_binary`).
    values.setdefault('cache_dir', os.path.abspath(os.path.expanduser(cache_dir)))
  if FLAGS['restart'].value and spec.module in BINARY_RESTART:  # a library call: unparsed
    values.setdefault('restart', True)
  values.setdefault('backend', runtime_flags.backend())  # every binary has --backend
  if runtime_flags.workers():
    values.setdefault('workers', runtime_flags.workers())
  if runtime_flags.concurrent_clients() is not None:
    values.setdefault('concurrent_clients', runtime_flags.concurrent_clients())
  if FLAGS['compile_local_loop'].value is not None:
    values.setdefault('compile_local_loop', FLAGS['compile_local_loop'].value)
  return [sys.executable, '-m', spec.module] + [
      f'--{k}={flag_str(v)}' for k, v in values.items()]


def plan_args(plan: RunPlan) -> trainer_flags.TrainerArgs:
  """The trainer's values of one run: the trainer's defaults, the flags of
  `PASSED_THROUGH` given on reproduce's own command line, then the plan's
  flags, each parsed as `python -m experiments.train` would parse it."""
  module_flags = FLAGS.get_flags_for_module(trainer_flags.__name__)
  names = {f.name for f in module_flags}
  unknown = sorted(set(plan.flags) - names)
  if unknown:
    raise ValueError(f'not trainer flags: {", ".join(unknown)} '
                     '(see python -m experiments.train --helpfull)')
  if not FLAGS.is_parsed():  # used as a library (tests): defaults stand in for argv
    FLAGS.mark_as_parsed()
  values = {f.name: f.default for f in module_flags}
  values.update({n: FLAGS[n].value for n in PASSED_THROUGH if n in names})
  given = set()
  for name, value in plan.flags.items():
    if value is None:  # unset: an algorithm's own default may replace it
      values[name] = None
    else:
      values[name] = FLAGS[name].parser.parse(
          value if isinstance(value, str) else flag_str(value))
      given.add(name)
  return trainer_flags.TrainerArgs(values, frozenset(given))


def validate_plan(plan: RunPlan):
  """Trainer validation of one run (cheap; raises ValueError); returns
  (TaskOptions, HParams, RunConfig) as `trainer_flags.validate` does."""
  try:
    return trainer_flags.validate(args=plan_args(plan))
  except trainer_flags.FlagError as e:
    raise ValueError(f'{plan.name}: {e}') from None


# ----------------------------------------------------------------------------
# Running.
