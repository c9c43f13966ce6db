"""What a task request says (`TaskOptions`, its fields declared once with their
flags) and how a bad one is refused (`TaskError`). Imports no TensorFlow."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.core.hparams import Config, above, hparam
from tff_algos.errors import UserError


class TaskError(UserError, ValueError):
  """Bad task request (unknown name, missing data file, bad option); the
  binaries print it as one `error:` line."""


class MissingData(TaskError):
  """A dataset file that is not there, in one line: what is missing, how to get
  it, and how to run without it (`offline`: the trainer's --use_synthetic_data
  by default; `offline_instead` lets a binary without that flag offer its own)."""

  OFFLINE = "or run with --use_synthetic_data (TFF's small synthetic stand-in)"

  def __init__(self, missing: str, get_it: str, offline: str = OFFLINE):
    self.missing, self.get_it, self.offline = missing, get_it, offline
    super().__init__(f'{missing}; {get_it}; {offline}')

  def __reduce__(self):  # what a --jobs worker sends back (args alone do not rebuild it)
    return MissingData, (self.missing, self.get_it, self.offline)

  def offline_instead(self, offline: str) -> 'MissingData':
    return MissingData(self.missing, self.get_it, offline)


# The splits of centralised data (`partition.split`; paper 003's; one device per
# Shakespeare role) and paper 003's synthetic heterogeneity: each task refuses
# those it does not read (`catalog`).
PARTITIONS = ('iid', 'sorted', 'dirichlet', 'natural', 'stratified')
SYNTHETIC_HETEROGENEITY = ('homogeneous', 'type1', 'type2', 'type3')


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskOptions(Config):
  """What a task is asked for: its data, split and model. Each field is the
  trainer's flag of the same name (`batch_size`: --client_batch_size)."""
  batch_size: int = hparam(20, 'Client minibatch size B.', flag='client_batch_size')
  cache_dir: Optional[str] = hparam(None, 'Where TFF dataset files (*.sqlite) live.')
  use_synthetic_data: bool = hparam(False, "Use TFF's tiny synthetic data.")
  model: Optional[str] = hparam(None, 'Task-specific model id (default: the task default).')
  seed: int = hparam(0, '')        # data partition / generation seed (RunConfig's --seed)
  num_clients: Optional[int] = hparam(None, 'Clients to split a centralised dataset into '
                                            '(or to subsample from a federated one).')
  dirichlet_alpha: float = hparam(0.5, 'Label-skew concentration for split datasets.',
                                  valid=above(0, '(smaller: fewer labels per client)',
                                              finite=True))
  num_runs: int = 1                  # repetitions vectorised into one model (quadratic)
  partition: str = hparam('iid', 'How a centralised dataset is split (logistic, '
                                 "cifar10_lenet): 'sorted' = label-sorted contiguous shards; "
                                 "paper-003 tasks: also 'stratified' (IID, equal class "
                                 "counts); shakespeare_003: 'natural' (one device per role) "
                                 "or 'iid'.", choices=PARTITIONS, enforce_choices=False)
  libsvm_path: Optional[str] = hparam(None, 'LIBSVM-format file for --task=logistic '
                                            '(default: the embedded scikit-learn '
                                            'breast-cancer set).')
  l2_reg: Optional[float] = hparam(None, 'l2 regularisation lambda (logistic; default L/n).')
  unbalanced_sigma: float = hparam(0.0, 'Paper-003 splits: lognormal client sizes (sigma; '
                                        'paper 0.3), 0 = balanced.')
  synthetic_heterogeneity: str = hparam(
      'homogeneous', 'synthetic_logistic (paper 003 A.1): which heterogeneity is on.',
      choices=SYNTHETIC_HETEROGENEITY, enforce_choices=False)
  max_client_examples: Optional[int] = hparam(
      None, 'Each training client keeps only its first N examples (as stored; paper 000: '
            '250 for StackOverflow).')
  test_examples: Optional[int] = hparam(
      None, 'The test set is its first N examples, for every evaluation (paper 000: 10,000 '
            'for StackOverflow).')
  max_elements_per_user: Optional[int] = hparam(
      None, "Each round a client trains on the first N of its shuffled examples (TFF "
            "baselines' ClientSpec.max_elements: a fresh subset every round). "
            "google-research's max_elements_per_user (Reddi et al.: 1000 on StackOverflow) "
            'takes before the shuffle: --max_client_examples.')
