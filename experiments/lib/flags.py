"""Trainer flags (names as in google-research/federated) and their validation.

Flags map onto three things, each in one place: `TaskOptions` (data),
`HParams` (the algorithm: its flags are defined from its fields) and
`RunConfig` (the round loop).
`validate()` checks all of them before any data is loaded or any computation
is traced, and raises `FlagError` (a `UserError`: the binaries print one
`error:` line). This module imports no TensorFlow, so that `--help`, flags
absl cannot parse and bad algorithm flags are answered at once; the task
checks may load it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import types
from typing import Any, Mapping, Optional, Sequence

from absl import flags

from experiments.lib import runtime_flags
from tasks import TaskOptions, list_tasks
from tff_algos.algorithms import registry
from tff_algos.core import hparams as hparams_lib
from tff_algos.errors import UserError
from tff_algos.flags import algorithm_flags
from tff_algos.flags import declared
from tff_algos.training.config import RunConfig

# Data.
# --task and --algorithm are enums of the two registries' names, so that a
# misspelt name is answered before TensorFlow loads (neither registry imports it).
TASK_NAMES = tuple(list_tasks())
ALGORITHM_NAMES = tuple(registry.ALGORITHMS)

flags.DEFINE_enum('task', 'digits', TASK_NAMES, 'Task name (see --list_tasks). Default: the '
                  'embedded scikit-learn digits split over 30 clients.')
# One flag per declared field of the task options (`tasks.TaskOptions`), of the
# algorithm configs and of the round loop (`RunConfig`): name, default and help
# come from the declarations; --seed is the loop's and the data's.
_TASK_SPECS = declared.specs([TaskOptions])
_RUN_SPECS = declared.specs([RunConfig])
declared.define([s for n, s in _TASK_SPECS.items() if n not in _RUN_SPECS], __name__)

# Algorithm.
flags.DEFINE_enum('algorithm', 'fedavg', ALGORITHM_NAMES,
                  'Algorithm name (see --list_algorithms).')


# One flag per field that an algorithm's config declares: its name, default and
# help (with the algorithms' own defaults where they differ) come from there.
declared.define(algorithm_flags.SPECS.values(), __name__, help_of=algorithm_flags.help_text)

# Round loop and outputs.
declared.define(_RUN_SPECS.values(), __name__)
flags.DEFINE_string('root_output_dir', 'runs', 'Root of experiment directories.')
flags.DEFINE_string('experiment_name', None,
                    'Experiment directory name (default: built from the flags).')
FLAGS = flags.FLAGS


class FlagError(UserError, ValueError):
  """A bad flag value or combination; the message names the flag and the fix."""


@dataclasses.dataclass(frozen=True)
class TrainerArgs:
  """The trainer's flag values, read once from the parsed flags.

  A binary that runs several configurations passes each as data,
  `args.override(algorithm='scaffold', seed=1)`, instead of rewriting the
  global flags. `given` holds the flags set on the command line or by an
  override (an algorithm's own defaults replace only the others).
  """
  values: Mapping[str, Any]
  given: frozenset[str] = frozenset()

  @classmethod
  def from_flags(cls) -> 'TrainerArgs':
    module_flags = FLAGS.get_flags_for_module(__name__)
    return cls(types.MappingProxyType({f.name: f.value for f in module_flags}),
               frozenset(f.name for f in module_flags if f.present))

  def override(self, **changes) -> 'TrainerArgs':
    unknown = sorted(set(changes) - set(self.values))
    if unknown:
      raise ValueError(f'unknown trainer flags {unknown}')
    return TrainerArgs(types.MappingProxyType({**self.values, **changes}),
                       self.given | frozenset(changes))

  def __getattr__(self, name: str):
    if name in ('values', 'given'):  # not yet set (copying)
      raise AttributeError(name)
    try:
      return self.values[name]
    except KeyError:
      raise AttributeError(name) from None

  def unset(self, name: str) -> bool:
    return name not in self.given and self.values[name] == FLAGS[name].default


def args_of(args: Optional[TrainerArgs]) -> TrainerArgs:
  """`args`, or the parsed flags' values when None."""
  return TrainerArgs.from_flags() if args is None else args


def task_options(args: Optional[TrainerArgs] = None) -> TaskOptions:
  a = args_of(args)
  return TaskOptions(**{d.field: a.values[d.flag]
                        for d in hparams_lib.declarations(TaskOptions).values()})


_HPARAMS = tuple(algorithm_flags.SPECS)


def hparams(grid: bool = False, args: Optional[TrainerArgs] = None):
  """The algorithm's hyperparameters. `grid`: the flags are shared by several
  algorithms (experiment grids), so other algorithms' own flags are dropped
  instead of refused."""
  a = args_of(args)
  hp = _flag_hparams(a)
  hp = algorithm_flags.with_defaults(a.algorithm, hp, [n for n in _HPARAMS if a.unset(n)])
  if not grid:
    return hp
  # Shared by runs of several algorithms (and optimisers): each run drops what
  # it does not read, other algorithms' flags and its optimisers' missing
  # hyperparameters (a SGDm momentum in an SGD baseline's run).
  return algorithm_flags.without_unused_optimizer_hparams(
      algorithm_flags.for_algorithm(a.algorithm, hp))


def _flag_hparams(args: TrainerArgs):
  """The hyperparameters exactly as the flags give them."""
  return algorithm_flags.HParams(**{n: args.values[n] for n in _HPARAMS})


def algorithm_defaults(args: Optional[TrainerArgs] = None) -> dict:
  """The algorithm's own defaults that replace flags left unset (e.g. FedGBO's K)."""
  a = args_of(args)
  hp = hparams(args=a)
  return {n: getattr(hp, n) for n in _HPARAMS if getattr(hp, n) != a.values[n]}


def warn_ignored_flags(algorithms, args: Optional[TrainerArgs] = None) -> None:
  """One stderr line per flag that some of a grid's algorithms do not read
  (e.g. --clip_norm: FedGBO's baselines clip, FedGBO does not)."""
  for flag, names in algorithm_flags.ignored_flags(algorithms, hparams(args=args)).items():
    print(f'note: --{flag} is not used by {", ".join(names)}; those run without it',
          file=sys.stderr)


def experiment_name(args: Optional[TrainerArgs] = None) -> str:
  a = args_of(args)
  if a.experiment_name:
    return a.experiment_name
  hp = hparams(args=a)
  parts = [a.task, a.algorithm, f'c{hp.client_optimizer}{a.client_learning_rate:g}',
           f's{a.server_optimizer}{hp.server_learning_rate:g}',
           f'K{hp.local_steps}' if hp.local_steps else f'E{a.client_epochs_per_round}',
           f'M{a.clients_per_round}', f'seed{a.seed}']
  return '_'.join(parts)


def run_config(output_dir, args: Optional[TrainerArgs] = None) -> RunConfig:
  a = args_of(args)
  return RunConfig(output_dir=output_dir, **{
      d.field: a.values[d.flag] for d in hparams_lib.declarations(RunConfig).values()})


_WARNED: set[str] = set()


def cohort_too_large(clients_per_round: int, num_clients: int, task: str) -> str:
  return (f'--clients_per_round={clients_per_round} exceeds the {num_clients} clients '
          f'of task {task!r}; set --clients_per_round={num_clients} or less')


NAME_MAX = 255  # bytes: the longest file name of Linux's and macOS's file systems


def check_dir_name(flag: str, name: Optional[str]) -> None:
  """Refuses (ValueError) a `--flag` that is not one directory name under the
  output root (None: unset): '..' or an absolute path wrote outside it."""
  if name is not None and (not re.fullmatch(r'[\w.\-]+', name) or name in ('.', '..')):
    raise ValueError(f'--{flag} must be one directory name of letters, digits, '
                     f'_ . - (not . or ..), got {name!r}')
  if name is not None and len(name.encode()) > NAME_MAX:
    raise ValueError(f'--{flag} is {len(name.encode())} bytes long; a directory name has at '
                     f'most {NAME_MAX}: choose a shorter one')


def check_not_a_file(flag: str, path: str) -> None:
  """Refuses (ValueError) a run directory `path` (named by `--flag`) that is a file."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f'--{flag} names {path}, which is a file, not a run directory: '
                     'choose another name or move the file')


def synthetic_unread(task: str) -> str:
  """The refusal of --use_synthetic_data for a task that has no synthetic stand-in."""
  from tasks import catalog  # pylint: disable=g-import-not-at-top
  readers = [t.name for t in catalog.TASKS if t.synthetic]
  return (f"--use_synthetic_data: task {task!r} has no synthetic stand-in (only the tasks on "
          f"TFF's datasets have one: {', '.join(readers)}); drop the flag")


def split_unread(spec, unread: Sequence[str]) -> str:
  """The refusal of split flags that the task (`spec`, its `TaskSpec`) does not read."""
  task = spec.name
  reads = (f'its split reads only {", ".join("--" + o for o in sorted(spec.splits))}'
           if spec.splits else 'its clients are fixed by the data or the task')
  them = 'it' if len(unread) == 1 else 'them'
  return (f'{", ".join("--" + o for o in unread)}: task {task!r} does not use {them} '
          f'({reads}; {spec.description}); leave {them} unset')


def tokens_unread(task: str) -> str:
  """The refusal of --token_weighting for a task without padded token sequences."""
  from tasks import catalog  # pylint: disable=g-import-not-at-top
  readers = [t.name for t in catalog.TASKS if t.tokens]
  return (f'--token_weighting: task {task!r} has no padded token sequences to count (a '
          f'client would be weighted by its targets that are not 0); the tasks that have '
          f'them: {", ".join(readers)}')


def validate(grid: bool = False, args: Optional[TrainerArgs] = None,
             check_cohort: bool = True, writable_root: bool = False):
  """All cheap checks; raises FlagError with one readable message.

  The algorithm's checks need no TensorFlow (its config imports none: a bad
  combination is answered in about a second); the task checks may load it.
  `check_cohort`: refuse a --clients_per_round above the task's client count
  where the catalog knows it, and --use_synthetic_data for a task without a
  synthetic stand-in (False where --task only stands in for data loaded
  otherwise, e.g. fedgbo's Sent140).
  `writable_root`: also make --root_output_dir and refuse it (`UserError`)
  when a file cannot be written there, after the checks of the flags (a bad
  flag leaves no directory behind).
  Returns (TaskOptions, HParams, RunConfig without an output directory).
  """
  a = args_of(args)
  try:
    check_dir_name('experiment_name', a.experiment_name)
    options = task_options(a)  # its declared ranges (--dirichlet_alpha)
    # The ranges of the flags as given, then every check of the algorithm
    # after its own defaults (FedGBO's SGDm takes --client_momentum where
    # --client_optimizer is left unset).
    algorithm_flags.check_ranges(_flag_hparams(a))
    hp = hparams(grid, a)
    algorithm_flags.check(a.algorithm, hp)
    for warning in set(algorithm_flags.warnings(a.algorithm, hp)) - _WARNED:
      _WARNED.add(warning)  # once a process: a grid validates each run twice
      print(f'warning: {warning}', file=sys.stderr)
    from tasks import check_options  # pylint: disable=g-import-not-at-top
    spec = check_options(a.task, options)
    known = spec.num_clients(options)  # before the data loads
    if check_cohort and known is not None and a.clients_per_round > known:
      raise ValueError(cohort_too_large(a.clients_per_round, known, a.task))
    if check_cohort and a.use_synthetic_data and not spec.synthetic:  # it was ignored
      raise ValueError(synthetic_unread(a.task))
    unread = spec.unread_splits(a.given, a.values)
    if unread:  # ignored too: digits split by label skew under --partition=iid
      raise ValueError(split_unread(spec, unread))
    if hp.token_weighting and not spec.tokens:
      raise ValueError(tokens_unread(a.task))
    config = run_config(None, a)
    runtime_flags.check()
    from experiments.lib import common  # pylint: disable=g-import-not-at-top
    check_not_a_file('experiment_name', output_dir(a))
    if writable_root:
      common.writable_dir(a.root_output_dir, 'root_output_dir')
  except hparams_lib.ConfigError as e:  # said with its flags
    raise FlagError(declared.said(e)) from None
  except ValueError as e:  # TaskError is a ValueError
    raise FlagError(str(e)) from None
  return options, hp, config


def output_dir(args: Optional[TrainerArgs] = None) -> str:
  a = args_of(args)
  return os.path.join(a.root_output_dir, experiment_name(a))


def flag_values(args: Optional[TrainerArgs] = None) -> dict:
  """This module's flag values and the backend's, for summary.json: the values
  the run used (the algorithm's own defaults and the fields it fixes)."""
  a = args_of(args)
  values = dict(a.values)
  values.update(algorithm_defaults(a))
  values.update(algorithm_flags.fixed_flags(a.algorithm))
  values.update(runtime_flags.values())
  return values


# Flags that may change between a run and its resume.
_RESUMABLE = ('total_rounds', 'progress', 'rounds_per_eval', 'rounds_per_checkpoint',
              'root_output_dir', 'experiment_name', 'max_eval_examples', 'cache_dir',
              'backend', 'workers', 'worker_network', 'concurrent_clients', 'compile_local_loop',
              'restart', 'max_rounds_all_dropped', 'rounds_per_call')


def run_identity(args: Optional[TrainerArgs] = None) -> dict:
  """The flag values that define a run (a resume must repeat them).

  Only flags that differ from their defaults: a flag added in a later version
  (at its default) does not make older runs unresumable. And the algorithm's
  own defaults that replace unset flags (`algorithm_defaults`: the LocalUpdate
  family's eta = 0.1, FedGBO's K = 10), so that a version whose algorithm
  defaults differ refuses the run instead of resuming it at other settings.
  """
  a = args_of(args)
  ident = {n: v for n, v in a.values.items()
           if n not in _RESUMABLE and v != FLAGS[n].default}
  ident['algorithm_defaults'] = json.loads(json.dumps(algorithm_defaults(a), default=str))
  return ident
