"""What one reproducible published experiment is (`Experiment`), as data.

An experiment is either a set of trainer runs (`TrainerRuns`: each run is an
algorithm plus trainer flags, executed by `tff_algos.training.loop.run_training`) or
one call of an existing experiment binary (`Binary`: e.g.
`experiments.quadratic_toy`, whose LAST stdout line is a JSON object). It
carries the published numbers it is compared with (`Published`), each naming
the measured quantity it corresponds to by a key:

* trainer runs: ``'<run label>/<metric>'`` with metric one of
  ``final_accuracy``, ``max_accuracy``, ``mean_accuracy_last<N>`` (mean eval
  accuracy over the evaluations in the last N rounds, Reddi et al.'s
  convention is N = 100; ``mean_<name>_last<N>`` the same for the evaluation
  metric ``eval/<name>``, e.g. ``mean_squared_error``), ``final_loss``, ``final_train_loss``,
  ``rounds_to<T>`` (first round whose eval accuracy >= T, T in [0, 1]),
  ``models_to<T>`` (models sent server -> client up to that round, per client
  slot: paper 003's metric), ``upload_gb_to<T>``, ``flops_to<T>``,
  ``min_train_loss_smooth<N>`` (lowest N-round moving average of the per-round
  training loss: paper 000's "Min Train Error", N = 200), ``fraction_sgd_steps``
  (sum_t K_t / (rounds K_0): paper 000's "Fraction SGD Steps Used").
  Accuracies are fractions in [0, 1]; published percentages are stored as
  fractions too (84.9 % -> 0.849).
* binaries: a dotted path into the JSON object of its last line, e.g.
  ``'final_x.decay_k'``.

Scales: ``full`` is the paper's setting on real data (meant for a GPU box,
resumable); ``smoke`` checks the pipeline in seconds: trainer runs switch to
`smoke_task` (the embedded digits by default), a few rounds, few clients, one
seed; binaries use `Binary.smoke_flags`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union


@dataclasses.dataclass(frozen=True)
class Published:
  key: str          # measured quantity this corresponds to (see module doc)
  value: float      # as published (accuracies as fractions)
  ref: str          # where in the paper: 'Table 2', 'Fig. 3 (left), read off the plot'
  label: str = ''   # row label in the report, default: the key
  approximate: bool = False   # read off a figure rather than printed in a table
  # A cost until a target is reached (e.g. models to a loss): None, not a
  # failure, where the run does not reach it (a smoke run, or a slow draw).
  to_target: bool = False


@dataclasses.dataclass(frozen=True)
class Run:
  label: str                 # unique within the experiment, e.g. 'feddyn_a0.01'
  algorithm: str             # tff_algos registry name
  flags: dict[str, Any] = dataclasses.field(default_factory=dict)  # trainer flags


@dataclasses.dataclass(frozen=True)
class TrainerRuns:
  task: str                  # tasks registry name at full scale
  runs: tuple[Run, ...]
  total_rounds: int
  clients_per_round: int
  task_flags: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. model, num_clients
  common_flags: dict[str, Any] = dataclasses.field(default_factory=dict)  # shared trainer flags
  seeds: tuple[int, ...] = (0,)
  rounds_per_eval: int = 10
  # Smoke scale.
  smoke_task: str = 'digits'
  smoke_task_flags: dict[str, Any] = dataclasses.field(default_factory=dict)
  smoke_rounds: int = 3
  smoke_clients_per_round: int = 3


@dataclasses.dataclass(frozen=True)
class Binary:
  module: str                # e.g. 'experiments.quadratic_toy'
  flags: dict[str, Any]      # full scale
  smoke_flags: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Experiment:
  name: str                  # prefixed by its paper: decaying_k_, nastya_, ...
  paper: str                 # e.g. '000 Charles & Konecny 2021' or 'Reddi et al. 2020'
  ref: str                   # the table/figure reproduced
  description: str
  runner: Union[TrainerRuns, Binary]
  published: tuple[Published, ...] = ()
  expected_runtime: str = ''  # full scale, e.g. '~6 h on one GPU'
  notes: str = ''
  data: Optional[str] = None  # what the full scale needs (files, --cache_dir)

  def __post_init__(self):
    prefixes = ('decaying_k_', 'nastya_', 'local_update_', 'feddyn_', 'fedgbo_',
                'fedopt_baselines_')
    if not self.name.startswith(prefixes):
      raise ValueError(f'experiment name {self.name!r} must start with one of {prefixes}')
    if isinstance(self.runner, TrainerRuns):
      labels = [r.label for r in self.runner.runs]
      if len(set(labels)) != len(labels):
        raise ValueError(f'{self.name}: duplicate run labels {labels}')
