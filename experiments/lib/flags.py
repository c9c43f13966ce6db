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
import math
import os
import re
import sys
import types
from typing import Any, Mapping, Optional, Sequence

from absl import flags

from experiments.lib import runtime_flags
from tasks import list_tasks
from tff_algos.errors import UserError
from tff_algos.flags import hparams as hparams_lib
from tff_algos.flags import registry
from tff_algos.flags import rules as flag_rules

# Data.
# --task and --algorithm are enums of the two registries' names, so that a
# misspelt name is answered before TensorFlow loads (neither registry imports it).
TASK_NAMES = tuple(list_tasks())
ALGORITHM_NAMES = tuple(registry.ALGORITHMS)

flags.DEFINE_enum('task', 'digits', TASK_NAMES, 'Task name (see --list_tasks). Default: the '
                  'embedded scikit-learn digits split over 30 clients.')
flags.DEFINE_string('model', None, 'Task-specific model id (default: the task default).')
flags.DEFINE_string('cache_dir', None, 'Where TFF dataset files (*.sqlite) live.')
flags.DEFINE_bool('use_synthetic_data', False, "Use TFF's tiny synthetic data.")
flags.DEFINE_integer('num_clients', None, 'Clients to split a centralised dataset into '
                     '(or to subsample from a federated one).')
flags.DEFINE_float('dirichlet_alpha', 0.5, 'Label-skew concentration for split datasets.')
flags.DEFINE_integer('client_batch_size', 20, 'Client minibatch size B.')
flags.DEFINE_integer('max_client_examples', None, 'Each training client keeps only its first '
                     'N examples (as stored; paper 000: 250 for StackOverflow).')
flags.DEFINE_integer('test_examples', None, 'The test set is its first N examples, for every '
                     'evaluation (paper 000: 10,000 for StackOverflow).')
flags.DEFINE_enum('partition', 'iid', ['iid', 'sorted', 'dirichlet', 'natural',
                                        'stratified'],
                  'How a centralised dataset is split (logistic, cifar10_lenet): '
                  "'sorted' = label-sorted contiguous shards; paper-003 tasks: also "
                  "'stratified' (IID, equal class counts); shakespeare_003: "
                  "'natural' (one device per role) or 'iid'.")
flags.DEFINE_string('libsvm_path', None, 'LIBSVM-format file for --task=logistic '
                    '(default: the embedded scikit-learn breast-cancer set).')
flags.DEFINE_float('l2_reg', None, 'l2 regularisation lambda (logistic; default L/n).')
flags.DEFINE_float('unbalanced_sigma', 0.0, 'Paper-003 splits: lognormal client sizes '
                   '(sigma; paper 0.3), 0 = balanced.')
flags.DEFINE_integer('max_elements_per_user', None, 'Each round a client trains on the '
                     'first N of its shuffled examples (TFF baselines\' ClientSpec.max_elements: '
                     'a fresh subset every round). google-research\'s max_elements_per_user '
                     '(Reddi et al.: 1000 on StackOverflow) takes before the shuffle: '
                     '--max_client_examples.')
flags.DEFINE_enum('synthetic_heterogeneity', 'homogeneous',
                  ['homogeneous', 'type1', 'type2', 'type3'],
                  'synthetic_logistic (paper 003 A.1): which heterogeneity is on.')

# Algorithm.
flags.DEFINE_enum('algorithm', 'fedavg', ALGORITHM_NAMES,
                  'Algorithm name (see --list_algorithms).')


def _define_hparams_flags() -> None:
  """One flag per `HParams` field: its name, default, help and choices."""
  for field in dataclasses.fields(hparams_lib.HParams):
    args = (field.name, field.default, field.metadata['help'])
    kind = str(field.type)
    if field.metadata['choices']:
      flags.DEFINE_enum(field.name, field.default, field.metadata['choices'],
                        field.metadata['help'])
    elif 'Sequence' in kind:
      flags.DEFINE_list(*args)
    else:
      define = {'bool': flags.DEFINE_bool, 'int': flags.DEFINE_integer,
                'float': flags.DEFINE_float, 'str': flags.DEFINE_string}
      define[kind.replace('Optional[', '').rstrip(']')](*args)


_define_hparams_flags()

# Round loop and outputs.
flags.DEFINE_integer('total_rounds', 100, 'Number of rounds.')
flags.DEFINE_integer('clients_per_round', 10, 'Clients sampled per round (M).')
flags.DEFINE_float('participation_prob', None,
                   'Each client joins each round with this probability, the draw repeated '
                   "while nobody joins (paper 003's code); unset: --clients_per_round "
                   'clients drawn uniformly.')
flags.DEFINE_integer('rounds_per_eval', 10, 'Evaluate every this many rounds.')
flags.DEFINE_integer('max_eval_examples', None,
                     'Periodic evaluations use this many test examples (a fixed sample; '
                     'the final one uses all). google-research uses 10000 for StackOverflow.')
flags.DEFINE_integer('rounds_per_checkpoint', 10, 'Checkpoint every this many rounds.')
flags.DEFINE_integer('rounds_per_call', 1,
                     'Run up to this many rounds in one TFF call between evaluations and '
                     'checkpoints (same models and metrics, bit for bit). Faster on small '
                     'models over many rounds (10 on the quadratic toy: ~6.5 -> ~4.2 ms a '
                     'trainer round, but ~1.5 s more at the first call; pays after ~700 '
                     'rounds). One round per call (with a note) for algorithms whose '
                     'clients keep states, --participation_prob and --workers.')
flags.DEFINE_enum('shuffle', 'rr', ['rr', 'so', 'none'],
                  "Client example order: 'rr' reshuffled every round, 'so' shuffled "
                  "once per client for the whole run, 'none' as stored.")
flags.DEFINE_integer('seed', 0, 'Seed of sampling, shuffling, init and data splits.')
flags.DEFINE_string('root_output_dir', 'runs', 'Root of experiment directories.')
flags.DEFINE_string('experiment_name', None,
                    'Experiment directory name (default: built from the flags).')
flags.DEFINE_bool('progress', True, 'Show a progress bar.')
flags.DEFINE_bool('restart', False, 'Delete the outputs already in <root_output_dir>/'
                  '<experiment_name> (checkpoints, metrics, client states) and start the '
                  'run over at round 0, instead of resuming it.')
flags.DEFINE_integer('max_rounds_all_dropped', 10,
                     'Stop the run after this many rounds in a row in which every client '
                     'diverged (non-finite update) and was dropped; 0: never stop.')
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


def task_options(args: Optional[TrainerArgs] = None):
  from tasks import TaskOptions  # pylint: disable=g-import-not-at-top
  a = args_of(args)
  return TaskOptions(batch_size=a.client_batch_size, cache_dir=a.cache_dir,
                     use_synthetic_data=a.use_synthetic_data, model=a.model,
                     seed=a.seed, num_clients=a.num_clients,
                     dirichlet_alpha=a.dirichlet_alpha, partition=a.partition,
                     libsvm_path=a.libsvm_path, l2_reg=a.l2_reg,
                     unbalanced_sigma=a.unbalanced_sigma,
                     synthetic_heterogeneity=a.synthetic_heterogeneity,
                     max_client_examples=a.max_client_examples,
                     test_examples=a.test_examples,
                     max_elements_per_user=a.max_elements_per_user)


_HPARAMS = tuple(f.name for f in dataclasses.fields(hparams_lib.HParams))


def hparams(grid: bool = False, args: Optional[TrainerArgs] = None) -> hparams_lib.HParams:
  """The algorithm's hyperparameters. `grid`: the flags are shared by several
  algorithms (experiment grids), so other algorithms' own flags are dropped
  instead of refused."""
  a = args_of(args)
  hp = _flag_hparams(a)
  hp = registry.with_defaults(a.algorithm, hp, [n for n in _HPARAMS if a.unset(n)])
  if not grid:
    return hp
  # Shared by runs of several algorithms (and optimisers): each run drops what
  # it does not read, other algorithms' flags and its optimisers' missing
  # hyperparameters (a SGDm momentum in an SGD baseline's run).
  return registry.for_algorithm(a.algorithm, hp).without_unused_optimizer_hparams()


def _flag_hparams(args: TrainerArgs) -> hparams_lib.HParams:
  """The hyperparameters exactly as the flags give them."""
  return hparams_lib.HParams(**{n: args.values[n] for n in _HPARAMS})


def algorithm_defaults(args: Optional[TrainerArgs] = None) -> dict:
  """The algorithm's own defaults that replace flags left unset (e.g. FedGBO's K)."""
  a = args_of(args)
  hp = hparams(args=a)
  return {n: getattr(hp, n) for n in _HPARAMS if getattr(hp, n) != a.values[n]}


def warn_ignored_flags(algorithms, args: Optional[TrainerArgs] = None) -> None:
  """One stderr line per algorithm-specific flag that some of a grid's algorithms
  ignore (e.g. --clip_norm: FedGBO's baselines clip, FedGBO does not)."""
  for flag, names in registry.ignored_flags(algorithms, hparams(args=args)).items():
    print(f'note: --{flag} is not used by {", ".join(names)}; those run without it',
          file=sys.stderr)


def experiment_name(args: Optional[TrainerArgs] = None) -> str:
  a = args_of(args)
  if a.experiment_name:
    return a.experiment_name
  hp = hparams(args=a)
  parts = [a.task, a.algorithm, f'c{hp.client_optimizer}{a.client_learning_rate:g}',
           f's{a.server_optimizer}{a.server_learning_rate:g}',
           f'K{hp.local_steps}' if hp.local_steps else f'E{a.client_epochs_per_round}',
           f'M{a.clients_per_round}', f'seed{a.seed}']
  return '_'.join(parts)


def run_config(output_dir, args: Optional[TrainerArgs] = None):
  from tff_algos.training.config import RunConfig  # pylint: disable=g-import-not-at-top
  a = args_of(args)
  return RunConfig(total_rounds=a.total_rounds, clients_per_round=a.clients_per_round,
                   seed=a.seed, rounds_per_eval=a.rounds_per_eval,
                   rounds_per_checkpoint=a.rounds_per_checkpoint,
                   output_dir=output_dir, progress=a.progress,
                   shuffle=a.shuffle, max_eval_examples=a.max_eval_examples,
                   restart=a.restart, max_rounds_all_dropped=a.max_rounds_all_dropped,
                   participation_prob=a.participation_prob,
                   rounds_per_call=a.rounds_per_call)


_WARNED: set[str] = set()


def cohort_too_large(clients_per_round: int, num_clients: int, task: str) -> str:
  return (f'--clients_per_round={clients_per_round} exceeds the {num_clients} clients '
          f'of task {task!r}; set --clients_per_round={num_clients} or less')


def check_dir_name(flag: str, name: Optional[str]) -> None:
  """Refuses (ValueError) a `--flag` that is not one directory name under the
  output root (None: unset): '..' or an absolute path wrote outside it."""
  if name is not None and (not re.fullmatch(r'[\w.\-]+', name) or name in ('.', '..')):
    raise ValueError(f'--{flag} must be one directory name of letters, digits, '
                     f'_ . - (not . or ..), got {name!r}')


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
             check_cohort: bool = True, writable_root: bool = False,
             check_config: bool = True):
  """All cheap checks; raises FlagError with one readable message.

  The checks that need no TensorFlow come first (the algorithm's flag rules
  included: a bad combination is answered in about a second); the task
  checks, the run config and the algorithm's config may load it.
  `check_cohort`: refuse a --clients_per_round above the task's client count
  where the catalog knows it, and --use_synthetic_data for a task without a
  synthetic stand-in (False where --task only stands in for data loaded
  otherwise, e.g. fedgbo's Sent140).
  `check_config`: False leaves out the last check, the algorithm config's
  values, which imports TensorFlow (a grid checks all its combinations
  without it first, so that one bad combination is said at once).
  `writable_root`: also make --root_output_dir and refuse it (`UserError`)
  when a file cannot be written there, after the checks of the flags alone
  (a bad flag leaves no directory behind) and before the algorithm's config
  loads TensorFlow, which took seconds before a bad directory was said.
  Returns (TaskOptions, HParams, RunConfig without an output directory).
  """
  a = args_of(args)
  try:
    check_dir_name('experiment_name', a.experiment_name)
    alpha = a.dirichlet_alpha
    if not (math.isfinite(alpha) and alpha > 0):  # the splits refused it after TF loaded
      raise ValueError(f'--dirichlet_alpha must be a finite number > 0 (smaller: fewer '
                       f'labels per client), got {alpha!r}')
    # Names and rates as given; hyperparameters an optimiser lacks are refused
    # by `registry.check_flags`, after the algorithm's own defaults (FedGBO's
    # SGDm takes --client_momentum where --client_optimizer is left unset).
    _flag_hparams(a).client_optimizer_spec(check_unused=False)
    _flag_hparams(a).server_optimizer_spec(check_unused=False)
    hp = hparams(grid, a)
    hp.check_ranges()
    if a.local_steps is not None and {'local_steps', 'client_epochs_per_round'} <= a.given:
      raise ValueError('--local_steps (K) and --client_epochs_per_round both set: K steps '
                       'replace the epochs (they were dropped without a word); leave '
                       '--client_epochs_per_round unset, or --local_steps for epochs')
    registry.check_flags(a.algorithm, hp)  # no TensorFlow up to here
    for warning in set(flag_rules.warnings(a.algorithm, hp)) - _WARNED:
      _WARNED.add(warning)  # once a process: a grid validates each run twice
      print(f'warning: {warning}', file=sys.stderr)
    from tasks import check_options  # pylint: disable=g-import-not-at-top
    options = task_options(a)
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
    created = []
    if writable_root:
      created = common.dirs_to_create(a.root_output_dir)
      common.writable_dir(a.root_output_dir, 'root_output_dir')
    if check_config:
      try:
        registry.check(a.algorithm, hp)
      except ValueError:
        common.remove_empty(created)  # a refused run leaves no new empty root behind
        raise
  except ValueError as e:  # TaskError is a ValueError
    raise FlagError(str(e)) from None
  return options, hp, config


def output_dir(args: Optional[TrainerArgs] = None) -> str:
  a = args_of(args)
  return os.path.join(a.root_output_dir, experiment_name(a))


def flag_values(args: Optional[TrainerArgs] = None) -> dict:
  """This module's flag values and the backend's, for summary.json."""
  a = args_of(args)
  values = dict(a.values)
  values.update(algorithm_defaults(a))
  values.update(runtime_flags.values())
  return values


# Flags that may change between a run and its resume.
_RESUMABLE = ('total_rounds', 'progress', 'rounds_per_eval', 'rounds_per_checkpoint',
              'root_output_dir', 'experiment_name', 'max_eval_examples', 'cache_dir',
              'backend', 'workers', 'concurrent_clients', 'compile_local_loop', 'restart',
              'max_rounds_all_dropped', 'rounds_per_call')


def run_identity(args: Optional[TrainerArgs] = None) -> dict:
  """The flag values that define a run (a resume must repeat them).

  Only flags that differ from their defaults: a flag added in a later version
  (at its default) does not make older runs unresumable.
  """
  a = args_of(args)
  return {n: v for n, v in a.values.items()
          if n not in _RESUMABLE and v != FLAGS[n].default}
