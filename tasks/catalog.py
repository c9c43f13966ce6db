"""Every task: its name, models, description, builder, and the checks of its
options that need no data.

Imports no TensorFlow, so that a task request with a bad name, model or
option combination is refused before TensorFlow loads. A task's builder
(`module:function`) is imported only when the task is built.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Optional

from tasks.options import SYNTHETIC_HETEROGENEITY, TaskError, TaskOptions  # pylint: disable=unused-import

# Where paper 001's LIBSVM files (mushrooms, ...) come from (`--libsvm_path`).
LIBSVM_SOURCE = 'https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html'
# `partition.split`'s schemes (cifar10_lenet, logistic) and paper 003's.
SPLITS = ('iid', 'sorted', 'dirichlet')
FEDDYN_SPLITS = ('iid', 'dirichlet')
PAPER003_SPLITS = FEDDYN_SPLITS + ('stratified',)
SHAKESPEARE_003_SPLITS = ('natural', 'iid')
# How a task split here divides its data; each task lists those it reads
# (`TaskSpec.splits`): one it does not read was dropped without a word (digits
# always splits by Dirichlet label skew, whatever --partition says).
SPLIT_OPTIONS = ('partition', 'dirichlet_alpha', 'unbalanced_sigma')
_SPLIT = frozenset({'partition', 'dirichlet_alpha'})
_ALPHA = frozenset({'dirichlet_alpha'})
# The training clients of a task split here when --num_clients is not given:
# its builder reads the number from here, and `TaskSpec.num_clients` answers a
# request (e.g. --clients_per_round) with it before the data or TensorFlow load.
DEFAULT_CLIENTS = dict(digits=30, quadratic=10_000, logistic=10, cifar10_lenet=10,
                       paper003=100, synthetic_logistic=20, shakespeare_003=100,
                       cifar10_image=500)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  builder_path: str          # 'module:function' taking TaskOptions, returning a Task
  models: tuple[str, ...]
  description: str
  check: Optional[Callable[[TaskOptions], None]] = None  # cheap option checks
  default_clients: Optional[int] = None  # tasks split here: clients without --num_clients
  synthetic: bool = False  # reads TFF's synthetic stand-in with --use_synthetic_data
  splits: frozenset[str] = frozenset()  # the SPLIT_OPTIONS its builder reads
  tokens: bool = False  # targets are padded token sequences (--token_weighting counts them)

  def unread_splits(self, given, values) -> list[str]:
    """The split options among `given` (names; `values` by name) that this
    task's split ignores. --unbalanced_sigma=0 (equal sizes, as the task has
    them; binaries set it for every task of a grid) is not one."""
    return [o for o in SPLIT_OPTIONS if o in given and o not in self.splits
            and not (o == 'unbalanced_sigma' and values[o] == 0)]

  def num_clients(self, options: TaskOptions) -> Optional[int]:
    """The training clients `options` give, where known without the data (tasks
    split here, real data); None: only the loaded task says."""
    if self.default_clients is None or options.use_synthetic_data:
      return None
    return options.num_clients or self.default_clients

  @property
  def builder(self) -> Callable:
    """The builder function (imports its module, and so TensorFlow)."""
    module, function = self.builder_path.split(':')
    return getattr(importlib.import_module(module), function)


def _require(value: str, choices: tuple[str, ...], message: str) -> None:
  if value not in choices:
    raise TaskError(message)


def check_split(options: TaskOptions) -> None:
  """`partition.split`'s schemes (iid, sorted, dirichlet)."""
  _require(options.partition, SPLITS, f'unknown partition {options.partition!r}; '
           f'choose one of {", ".join(SPLITS)}')


def check_paper003_split(options: TaskOptions) -> None:
  """Paper 003's splits and their options."""
  _require(options.partition, PAPER003_SPLITS, f'paper-003 tasks split '
           f'{"|".join(PAPER003_SPLITS)}, not {options.partition!r}')
  if options.partition == 'dirichlet' and options.dirichlet_alpha <= 0:
    raise TaskError(f'dirichlet_alpha must be > 0, got {options.dirichlet_alpha}')
  if options.partition == 'stratified' and options.unbalanced_sigma:
    raise TaskError('--partition=stratified gives every client the same class counts: '
                    'leave --unbalanced_sigma at 0')


def check_heterogeneity(options: TaskOptions) -> None:
  value = options.synthetic_heterogeneity
  _require(value, SYNTHETIC_HETEROGENEITY, f'unknown heterogeneity {value!r}; '
           f'choose one of {", ".join(SYNTHETIC_HETEROGENEITY)}')


def check_shakespeare_003_split(options: TaskOptions) -> None:
  _require(options.partition, SHAKESPEARE_003_SPLITS, f'shakespeare_003 splits '
           f'{"|".join(SHAKESPEARE_003_SPLITS)} (--partition), not {options.partition!r}')


def _paper003(name: str, function: str, models: tuple[str, ...],
              description: str) -> TaskSpec:
  return TaskSpec(name, f'tasks.feddyn_data:{function}', models, description,
                  check_paper003_split, DEFAULT_CLIENTS['paper003'],
                  splits=frozenset(SPLIT_OPTIONS))


TASKS = (
    TaskSpec('digits', 'tasks.embedded:build', ('mlp', 'logistic'),
             'scikit-learn digits, Dirichlet label skew (offline default)',
             default_clients=DEFAULT_CLIENTS['digits'], splits=_ALPHA),
    TaskSpec('quadratic', 'tasks.quadratic:build', ('scalar',),
             'paper 000 §3 toy: f(x; z) = z x^2/2 - x, z ~ z^-1/2 on [1,3]',
             default_clients=DEFAULT_CLIENTS['quadratic']),
    TaskSpec('emnist_character', 'tasks.emnist:build',
             ('cnn_dropout', 'cnn', '2nn', 'femnist_cnn'),
             'Federated EMNIST-62 (FEMNIST, 3,400 writers; TFF emnist_all.sqlite): '
             "TFF's cnn_dropout/cnn/2nn or the papers' femnist_cnn", synthetic=True),
    TaskSpec('shakespeare_character', 'tasks.shakespeare:build', ('lstm', 'gru', 'gru128'),
             'Shakespeare next-character prediction (715 roles; TFF shakespeare.sqlite):'
             " TFF's LSTM or the papers' GRUs (256 / 128 units)", synthetic=True, tokens=True),
    TaskSpec('stackoverflow_tag', 'tasks.stackoverflow:build_tag',
             ('logreg', 'logreg_mean', 'logreg_code'),
             'StackOverflow tag prediction (342,477 users; TFF stackoverflow.sqlite): '
             '1-vs-rest logistic regression, 10k-word bag of words -> 500 tags, '
             'recall@5; logreg_mean: loss averaged over the batch (paper 000); '
             "logreg_code: Reddi et al.'s bag of words (a mean over all words)", synthetic=True),
    TaskSpec('stackoverflow_word', 'tasks.stackoverflow:build_word', ('lstm',),
             'StackOverflow next-word prediction (342,477 users; TFF '
             "stackoverflow.sqlite): TFF's LSTM, 10k vocabulary, sequences of 20", synthetic=True,
             tokens=True),
    TaskSpec('cifar100_image', 'tasks.cifar100:build',
             ('resnet18', 'resnet18_gn2', 'cnn004', 'cnn004_code'),
             'Federated CIFAR-100 (500 clients, Pachinko allocation; TFF '
             "cifar100.sqlite): TFF's GroupNorm ResNet-18 (24x24; resnet18_gn2: 2 groups, Reddi "
             "et al.'s code) or paper 004's CNN "
             "(28x28 crops, the paper's text; cnn004_code: 32x32, the authors' code)",
             synthetic=True),
    TaskSpec('logistic', 'tasks.libsvm:build', ('logreg',),
             'l2-regularised logistic regression on a LIBSVM file '
             '(--libsvm_path) or, offline, sklearn breast cancer (paper 001)', check_split,
             DEFAULT_CLIENTS['logistic'], splits=_SPLIT),
    TaskSpec('cifar10_lenet', 'tasks.cifar10:build', ('lenet5',),
             'LeNet-5 on CIFAR-10 from a prepared tensorflow-datasets '
             'cifar10 (paper 001; use --client_batch_size=1024)', check_split,
             DEFAULT_CLIENTS['cifar10_lenet'], splits=_SPLIT),
    _paper003('feddyn_digits', 'build_digits', ('mlp_200_100', 'logistic'),
              'scikit-learn digits split as paper 003 (iid|dirichlet, '
              '--unbalanced_sigma), 100 clients (offline)'),
    _paper003('mnist', 'build_mnist', ('mlp_200_200', 'mlp_200_100'),
              'MNIST (prepared TFDS), paper 003 splits, MLP 200-200 (FedAvg 2NN)'),
    _paper003('emnist_letters10', 'build_emnist_letters10', ('mlp_100_100', 'mlp_200_100'),
              "EMNIST-L: first 10 letters of TFDS 'emnist/letters' "
              '(prepared), paper 003 splits, MLP 100-100'),
    _paper003('cifar10', 'build_cifar10', ('cnn003', 'cnn003_text'),
              'CIFAR-10 (prepared TFDS), paper 003 splits and CNN'),
    _paper003('cifar100_split', 'build_cifar100', ('cnn003', 'cnn003_text'),
              "CIFAR-100 (prepared TFDS) split as paper 003 (not TFF's "
              'federated CIFAR-100), paper 003 CNN'),
    TaskSpec('synthetic_logistic', 'tasks.feddyn_data:build_synthetic', ('logreg',),
             'paper 003 A.1 synthetic multiclass logistic problem, 20 '
             'clients; --synthetic_heterogeneity=homogeneous|type1|type2|type3',
             check_heterogeneity, DEFAULT_CLIENTS['synthetic_logistic']),
    TaskSpec('shakespeare_003', 'tasks.feddyn_data:build_shakespeare', ('lstm100',),
             "paper 003's Shakespeare: 100 devices x 2,000 samples (80 characters "
             "-> the next), --partition=natural (roles) | iid; 2 x LSTM 100",
             check_shakespeare_003_split, DEFAULT_CLIENTS['shakespeare_003'], synthetic=True,
             splits=frozenset({'partition'})),
    TaskSpec('emnist_autoencoder', 'tasks.emnist_autoencoder:build', ('tff_ae',),
             "Federated EMNIST-62 autoencoder (3,400 writers; TFF emnist_all.sqlite): TFF's "
             'bottleneck autoencoder, MSE (Reddi et al.)', synthetic=True),
    TaskSpec('cifar10_image', 'tasks.cifar10_image:build', ('resnet18', 'resnet18_gn2'),
             'CIFAR-10 over 500 clients of 100 images by LDA label skew (Reddi et al.; '
             "prepared tensorflow-datasets cifar10 in --cache_dir): TFF's GroupNorm ResNet-18, "
             '24x24 random crops and flips', default_clients=DEFAULT_CLIENTS['cifar10_image'],
             splits=_ALPHA),
)
