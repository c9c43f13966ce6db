"""What a task request says (`TaskOptions`) and how a bad one is refused
(`TaskError`). Imports no TensorFlow."""

from __future__ import annotations

import dataclasses
from typing import Optional

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


@dataclasses.dataclass(frozen=True)
class TaskOptions:
  batch_size: int = 20
  cache_dir: Optional[str] = None
  use_synthetic_data: bool = False
  model: Optional[str] = None        # task-specific model id; None = task default
  seed: int = 0                      # data partition / generation seed
  num_clients: Optional[int] = None  # for tasks partitioned here (None = default)
  dirichlet_alpha: float = 0.5       # label-skew concentration (partitioned tasks)
  num_runs: int = 1                  # repetitions vectorised into one model (quadratic)
  partition: str = 'iid'             # 'iid' | 'sorted' | 'dirichlet' (tasks split here)
  libsvm_path: Optional[str] = None  # LIBSVM-format file (logistic; None = embedded data)
  l2_reg: Optional[float] = None     # lambda of l2-regularised tasks (None = task default)
  unbalanced_sigma: float = 0.0      # lognormal client sizes (paper 003; 0 = balanced)
  synthetic_heterogeneity: str = 'homogeneous'  # synthetic_logistic: type1|type2|type3
  max_client_examples: Optional[int] = None  # each client keeps its first N examples
  test_examples: Optional[int] = None  # the test set is its first N examples (fixed)
  max_elements_per_user: Optional[int] = None  # per-round cap of a client's examples
