r"""Federated training of one (task, algorithm) pair.

    python -m experiments.train                      # digits, FedAvg, 100 rounds
    python -m experiments.train --task=emnist_character --cache_dir=~/.tff \
        --algorithm=fedavg --server_optimizer=adam --server_learning_rate=0.01 \
        --local_steps=10 --local_steps_decay=0.999 --total_rounds=4000

Re-running the same command resumes from the last checkpoint in
<root_output_dir>/<experiment_name>/. Prints a table of evaluations and writes
curves.png there.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

from experiments import common
from experiments import flags as trainer_flags
from experiments import report
from experiments import runtime_flags

flags.adopt_module_key_flags(trainer_flags)
flags.adopt_module_key_flags(runtime_flags)

flags.DEFINE_bool('list_tasks', False, 'List tasks and exit.')
flags.DEFINE_bool('list_algorithms', False, 'List algorithms and exit.')
FLAGS = flags.FLAGS


def fit_cohort_to(num_clients: int, task_name: str) -> None:
  """--clients_per_round against the task's clients: TFF's synthetic data has
  only a few, so with --use_synthetic_data an unset --clients_per_round takes
  them all; otherwise a cohort larger than the task is a `FlagError`."""
  if FLAGS.clients_per_round <= num_clients:
    return
  if FLAGS.use_synthetic_data and not FLAGS['clients_per_round'].present:
    FLAGS.clients_per_round = num_clients
    print(f'note: --use_synthetic_data: task {task_name!r} has {num_clients} clients; '
          f'using --clients_per_round={num_clients}', file=sys.stderr)
    return
  raise trainer_flags.FlagError(
      f'--clients_per_round={FLAGS.clients_per_round} exceeds the {num_clients} clients '
      f'of task {task_name!r}; set --clients_per_round={num_clients} or less')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not (FLAGS.list_tasks or FLAGS.list_algorithms):
    options, hp, _ = trainer_flags.validate()
  common.quiet_logs()
  from tasks import get_task, list_tasks
  from tff_algos import registry
  if FLAGS.list_tasks:
    for name, spec in list_tasks().items():
      print(f'{name:24s} models: {", ".join(spec.models):40s} {spec.description}')
    return 0
  if FLAGS.list_algorithms:
    for name, spec in sorted(registry.ALGORITHMS.items()):
      print(f'{name:24s} {spec.description}')
    return 0

  from tff_algos import training
  task = get_task(FLAGS.task, options)  # data errors surface before any worker starts
  fit_cohort_to(len(task.client_ids), task.name)
  out_dir = trainer_flags.output_dir()
  from tff_algos import run_dir  # pylint: disable=g-import-not-at-top
  run_dir.check_free(out_dir)  # another run there: refused before any tracing
  with runtime_flags.managed_context():
    algorithm = registry.build(FLAGS.algorithm, task.model_fn, hp)
    print(f'{algorithm.name} on {task.name} ({task.info.get("model")}, '
          f'{len(task.client_ids)} clients) -> {out_dir}', flush=True)
    result = training.run_training(algorithm, task, trainer_flags.run_config(out_dir),
                                   extra_summary={'flags': trainer_flags.flag_values()},
                                   identity=trainer_flags.run_identity())
  report.print_run_results(out_dir, result.final_eval)
  return 0


if __name__ == '__main__':
  common.run(main)
