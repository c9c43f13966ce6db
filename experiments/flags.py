"""Trainer flags (names as in google-research/federated) and their validation.

Flags map onto three things, each in one place: `TaskOptions` (data),
`registry.HParams` (the algorithm) and `RunConfig` (the round loop).
`validate()` checks all of them before any data is loaded or any computation
is traced, and raises `FlagError` (a `UserError`: the binaries print one
`error:` line). This module imports no TensorFlow, so that `--help` and flags
absl cannot parse are answered at once; the checks that need the task and
algorithm registries load it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from absl import flags

from experiments import runtime_flags
from tff_algos import hparams as hparams_lib
from tff_algos.core import optimizers
from tff_algos.errors import UserError

# Data.
# The registries' names, here so that a misspelt name is answered before
# TensorFlow loads (the registries import it); tests/test_registry.py keeps
# them equal to `tasks.list_tasks()` and `tff_algos.registry.ALGORITHMS`.
TASK_NAMES = (
    'cifar10', 'cifar100_image', 'cifar100_split', 'cifar10_image', 'cifar10_lenet', 'digits',
    'emnist_autoencoder', 'emnist_character', 'emnist_letters10', 'feddyn_digits', 'logistic',
    'mnist', 'quadratic', 'shakespeare_003', 'shakespeare_character', 'stackoverflow_tag',
    'stackoverflow_word', 'synthetic_logistic')
ALGORITHM_NAMES = (
    'fedavg', 'fedsgd', 'local_update', 'reptile', 'fomaml', 'kmaml', 'minibatch_sgd',
    'local_update_decay', 'nastya', 'fedrr', 'feddyn', 'scaffold', 'fedprox', 'fedmax', 'fedgbo',
    'mfl', 'mimelite', 'mimexlite')

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
                     'first N of its shuffled examples (google-research\'s flag: a fresh '
                     'subset every round; Reddi et al.: 1000 on StackOverflow).')
flags.DEFINE_enum('synthetic_heterogeneity', 'homogeneous',
                  ['homogeneous', 'type1', 'type2', 'type3'],
                  'synthetic_logistic (paper 003 A.1): which heterogeneity is on.')

# Algorithm.
flags.DEFINE_enum('algorithm', 'fedavg', ALGORITHM_NAMES,
                  'Algorithm name (see --list_algorithms).')
flags.DEFINE_enum('client_optimizer', 'sgd', optimizers.NAMES, 'Client optimizer.')
flags.DEFINE_float('client_learning_rate', 0.1, 'Client learning rate gamma_0.')
flags.DEFINE_float('client_momentum', None, 'Client momentum (sgdm).')
flags.DEFINE_enum('server_optimizer', 'sgd', optimizers.NAMES, 'Server optimizer.')
flags.DEFINE_float('server_learning_rate', 1.0, 'Server learning rate eta_0.')
flags.DEFINE_float('server_momentum', None, 'Server momentum (sgdm).')
flags.DEFINE_float('server_beta_1', None, 'Server beta_1 (adam, yogi).')
flags.DEFINE_float('server_beta_2', None, 'Server beta_2 (adam, yogi; rmsprop decay).')
flags.DEFINE_float('server_epsilon', None, 'Server epsilon (adaptive optimizers).')
flags.DEFINE_float('server_initial_accumulator', None,
                   'Initial second-moment accumulator (yogi, adagrad).')
flags.DEFINE_integer('client_epochs_per_round', 1,
                     'Local epochs E per round (used when --local_steps is unset).')
flags.DEFINE_integer('local_steps', None, 'Local steps K_0 per round (overrides epochs).')
flags.DEFINE_float('local_steps_decay', 1.0, 'd_K: K_t = ceil(K_0 d_K^t).')
flags.DEFINE_float('client_lr_decay', 1.0, 'd_gamma: gamma_t = gamma_0 d_gamma^t.')
flags.DEFINE_float('server_lr_decay', 1.0, 'd_eta: eta_t = eta_0 d_eta^t.')
flags.DEFINE_list('client_lr_milestones', None, 'nastya/fedrr: gamma divided by 10 at each '
                  'of these rounds (PyTorch MultiStepLR; paper 001: 150,200).')
flags.DEFINE_bool('uniform_weighting', False, 'Weight clients equally, 1/M (TFF\'s '
                  'ClientWeighting.UNIFORM), not by examples n_i (NUM_EXAMPLES).')
# LocalUpdate / LocalUpdateDecay (paper 002).
flags.DEFINE_string('theta', 'reptile', 'LocalUpdate step weights: reptile, fomaml, kmaml, '
                    'minibatch_sgd (K = --local_steps, default 10) or numbers "1,0,0.5".')
flags.DEFINE_float('decay_min_delta', 1e-4, 'LocalUpdateDecay: improvement threshold Delta.')
flags.DEFINE_float('client_lr_decay_factor', 0.1, 'LocalUpdateDecay: gamma <- alpha gamma.')
flags.DEFINE_float('server_lr_decay_factor', 0.9, 'LocalUpdateDecay: eta <- beta eta.')
flags.DEFINE_integer('decay_patience', 100, 'LocalUpdateDecay: patience P (rounds).')
flags.DEFINE_integer('decay_window', 100, 'LocalUpdateDecay: moving-average window W.')
flags.DEFINE_integer('decay_cooldown', 100, 'LocalUpdateDecay: cooldown C (also at start).')
flags.DEFINE_bool('decay_reference_semantics', False,
                  "LocalUpdateDecay: the reference code's rule (Keras's best, moved only by "
                  'improvements > Delta; window starts at inf; example-weighted means unless '
                  "--uniform_weighting) instead of the paper's eq. 25 (running minimum).")
# Nastya (paper 001).
flags.DEFINE_bool('server_adaptive_lr', False, 'Nastya: adaptive server step of Malitsky '
                  '& Mishchenko (2020), starting from --server_learning_rate.')
# Client optimiser statistics (adam, rmsprop; FedGBO, MFL, Mimelite: paper 004).
flags.DEFINE_float('client_beta_1', None, 'Client beta_1 (adam; fedgbo/mime/mfl).')
flags.DEFINE_float('client_beta_2', None, 'Client beta_2 (adam; rmsprop decay).')
flags.DEFINE_float('client_epsilon', None, 'Client epsilon (adam, rmsprop).')
flags.DEFINE_bool('gbo_reference_conventions', False, 'FedGBO/MFL/Mimelite/MimeXlite: '
                  "the reference code's conventions (v_0 = 1, no bias correction, "
                  'eps = 1e-3, unweighted client mean).')
# FedDyn / SCAFFOLD / FedProx (paper 003).
flags.DEFINE_float('feddyn_alpha', 0.01, 'FedDyn: dynamic regulariser alpha.')
flags.DEFINE_bool('feddyn_adaptive_alpha', False, 'FedDyn: alpha_k = alpha / (n_k / mean n) '
                  '(reference code).')
flags.DEFINE_bool('feddyn_weight_decay_form', False, 'FedDyn: the alpha quadratic as SGD '
                  'weight decay, outside gradient clipping (reference code).')
flags.DEFINE_bool('scaffold_reference_conventions', False, "SCAFFOLD as paper 003's code: "
                  'c scaled by mean n / n_i in the local step and n_i / mean n in the '
                  'server sum; c_i+ divides by the initial learning rate.')
flags.DEFINE_bool('report_device_average', False, 'Evaluate the average of all device '
                  'models, as paper 003 does (feddyn, scaffold: plain mean; fedavg, '
                  'fedprox: weighted as the server weights clients); one more upload.')
flags.DEFINE_float('client_weight_decay', 0.0, 'l2 weight decay of local steps, added to '
                   'the (clipped) gradient: plain L2, also with an Adam client (feddyn, '
                   'scaffold, fedavg, fedprox, fedmax; paper 003 reference code: 1e-3).')
flags.DEFINE_float('clip_norm', None, 'Global-norm clipping of local gradients, before the '
                   'weight decay (feddyn, scaffold, fedavg, fedprox, fedmax; paper 003 '
                   'reference code: 10). Unset: off.')
flags.DEFINE_float('prox_mu', 0.01, 'FedProx proximal strength mu.')
# FedMAX (paper 004 baseline).
flags.DEFINE_float('fedmax_beta', 1.0, 'FedMAX: weight beta of KL(softmax(penultimate '
                   'activations) || uniform) in the local loss.')
flags.DEFINE_bool('fedmax_reference_kl', False, "FedMAX: KL(uniform || softmax(.)), the "
                  "direction of the authors' code.")

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


def task_options():
  from tasks import TaskOptions  # pylint: disable=g-import-not-at-top
  return TaskOptions(batch_size=FLAGS.client_batch_size, cache_dir=FLAGS.cache_dir,
                     use_synthetic_data=FLAGS.use_synthetic_data, model=FLAGS.model,
                     seed=FLAGS.seed, num_clients=FLAGS.num_clients,
                     dirichlet_alpha=FLAGS.dirichlet_alpha, partition=FLAGS.partition,
                     libsvm_path=FLAGS.libsvm_path, l2_reg=FLAGS.l2_reg,
                     unbalanced_sigma=FLAGS.unbalanced_sigma,
                     synthetic_heterogeneity=FLAGS.synthetic_heterogeneity,
                     max_client_examples=FLAGS.max_client_examples,
                     test_examples=FLAGS.test_examples,
                     max_elements_per_user=FLAGS.max_elements_per_user)


def hparams(grid: bool = False) -> hparams_lib.HParams:
  """The algorithm's hyperparameters. `grid`: the flags are shared by several
  algorithms (experiment grids), so other algorithms' own flags are dropped
  instead of refused."""
  hp = _flag_hparams()
  from tff_algos import registry  # pylint: disable=g-import-not-at-top
  names = [f.name for f in dataclasses.fields(hparams_lib.HParams)]
  hp = registry.with_defaults(FLAGS.algorithm, hp, [n for n in names if _unset(n)])
  return registry.for_algorithm(FLAGS.algorithm, hp) if grid else hp


def _flag_hparams() -> hparams_lib.HParams:
  """The hyperparameters exactly as the flags give them (no TensorFlow needed)."""
  names = [f.name for f in dataclasses.fields(hparams_lib.HParams)]
  return hparams_lib.HParams(**{n: getattr(FLAGS, n) for n in names})


def _unset(name: str) -> bool:
  flag = FLAGS[name]
  return not flag.present and flag.value == flag.default


def algorithm_defaults() -> dict:
  """The algorithm's own defaults that replace flags left unset (e.g. FedGBO's K)."""
  names = [f.name for f in dataclasses.fields(hparams_lib.HParams)]
  hp = hparams()
  return {n: getattr(hp, n) for n in names if getattr(hp, n) != getattr(FLAGS, n)}


def warn_ignored_flags(algorithms) -> None:
  """One stderr line per algorithm-specific flag that some of a grid's algorithms
  ignore (e.g. --clip_norm: FedGBO's baselines clip, FedGBO does not)."""
  from tff_algos import registry  # pylint: disable=g-import-not-at-top
  for flag, names in registry.ignored_flags(algorithms, hparams()).items():
    print(f'note: --{flag} is not used by {", ".join(names)}; those run without it',
          file=sys.stderr)


def experiment_name() -> str:
  if FLAGS.experiment_name:
    return FLAGS.experiment_name
  hp = hparams()
  parts = [FLAGS.task, FLAGS.algorithm, f'c{hp.client_optimizer}{FLAGS.client_learning_rate:g}',
           f's{FLAGS.server_optimizer}{FLAGS.server_learning_rate:g}',
           f'K{hp.local_steps}' if hp.local_steps else f'E{FLAGS.client_epochs_per_round}',
           f'M{FLAGS.clients_per_round}', f'seed{FLAGS.seed}']
  return '_'.join(parts)


def run_config(output_dir):
  from tff_algos.training import RunConfig  # pylint: disable=g-import-not-at-top
  return RunConfig(total_rounds=FLAGS.total_rounds,
                   clients_per_round=FLAGS.clients_per_round, seed=FLAGS.seed,
                   rounds_per_eval=FLAGS.rounds_per_eval,
                   rounds_per_checkpoint=FLAGS.rounds_per_checkpoint,
                   output_dir=output_dir, progress=FLAGS.progress,
                   shuffle=FLAGS.shuffle, max_eval_examples=FLAGS.max_eval_examples,
                   restart=FLAGS.restart,
                   max_rounds_all_dropped=FLAGS.max_rounds_all_dropped,
                   participation_prob=FLAGS.participation_prob)


def validate(grid: bool = False):
  """All cheap checks; raises FlagError with one readable message.

  The checks that need no TensorFlow come first (a typo there is answered
  in about a second); the task and algorithm checks load it.
  """
  try:
    name = FLAGS.experiment_name
    if name is not None and (not re.fullmatch(r'[\w.\-]+', name) or name in ('.', '..')):
      raise ValueError(f'--experiment_name must be one directory name of letters, digits, '
                       f'_ . - (not . or ..), got {name!r}')
    _flag_hparams().client_optimizer_spec()
    _flag_hparams().server_optimizer_spec()
    from tasks import check_options  # pylint: disable=g-import-not-at-top
    options = task_options()
    check_options(FLAGS.task, options)
    from tff_algos import registry  # pylint: disable=g-import-not-at-top
    hp = hparams(grid)
    registry.check(FLAGS.algorithm, hp)
    config = run_config(None)
    runtime_flags.check()
  except ValueError as e:  # TaskError is a ValueError
    raise FlagError(str(e)) from None
  return options, hp, config


def output_dir() -> str:
  return os.path.join(FLAGS.root_output_dir, experiment_name())


def flag_values() -> dict:
  """This module's flag values and the backend's, for summary.json."""
  values = {f.name: f.value for f in FLAGS.get_flags_for_module(__name__)}
  values.update(algorithm_defaults())
  values.update(runtime_flags.values())
  return values


# Flags that may change between a run and its resume.
_RESUMABLE = ('total_rounds', 'progress', 'rounds_per_eval', 'rounds_per_checkpoint',
              'root_output_dir', 'experiment_name', 'max_eval_examples', 'cache_dir',
              'backend', 'workers', 'concurrent_clients', 'restart',
              'max_rounds_all_dropped')


def run_identity() -> dict:
  """The flag values that define a run (a resume must repeat them).

  Only flags that differ from their defaults: a flag added in a later version
  (at its default) does not make older runs unresumable.
  """
  return {f.name: f.value for f in FLAGS.get_flags_for_module(__name__)
          if f.name not in _RESUMABLE and f.value != f.default}
