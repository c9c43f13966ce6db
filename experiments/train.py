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

import sys

from absl import flags

from experiments import report
from experiments.lib import common
from experiments.lib import flags as trainer_flags
from experiments.lib import runtime_flags

flags.adopt_module_key_flags(trainer_flags)
flags.adopt_module_key_flags(runtime_flags)

flags.DEFINE_bool('list_tasks', False, 'List tasks and exit.')
flags.DEFINE_bool('list_algorithms', False, 'List algorithms and exit.')
FLAGS = flags.FLAGS


def fit_cohort_to(args: trainer_flags.TrainerArgs, num_clients: int,
                  task_name: str) -> trainer_flags.TrainerArgs:
  """--clients_per_round against the task's clients: TFF's synthetic data has
  only a few, so with --use_synthetic_data an unset --clients_per_round takes
  them all; otherwise a cohort larger than the task is a `FlagError`."""
  if args.clients_per_round <= num_clients:
    return args
  if args.use_synthetic_data and 'clients_per_round' not in args.given:
    print(f'note: --use_synthetic_data: task {task_name!r} has {num_clients} clients; '
          f'using --clients_per_round={num_clients}', file=sys.stderr)
    return args.override(clients_per_round=num_clients)
  raise trainer_flags.FlagError(
      trainer_flags.cohort_too_large(args.clients_per_round, num_clients, task_name))


def _list(what: str) -> int:
  from tasks import list_tasks  # pylint: disable=g-import-not-at-top
  from tff_algos.algorithms import registry  # pylint: disable=g-import-not-at-top
  if what == 'tasks':
    for name, spec in list_tasks().items():
      print(f'{name:24s} models: {", ".join(spec.models):40s} {spec.description}')
  else:
    for name, spec in sorted(registry.ALGORITHMS.items()):
      print(f'{name:24s} {spec.description}')
  return 0


def main(argv):
  del argv  # `common.run` refuses positional arguments
  args = trainer_flags.TrainerArgs.from_flags()
  created = common.dirs_to_create(args.root_output_dir)
  if not (FLAGS.list_tasks or FLAGS.list_algorithms):
    # An unusable --root_output_dir (a file, /proc/x) is refused before
    # TensorFlow and the data load; the run's own directory, whose name may
    # follow the task (`fit_cohort_to`), is checked once the task is known.
    options, hp, _ = trainer_flags.validate(args=args, writable_root=True)
  common.quiet_logs()
  if FLAGS.list_tasks or FLAGS.list_algorithms:
    return _list('tasks' if FLAGS.list_tasks else 'algorithms')

  from tasks import get_task  # pylint: disable=g-import-not-at-top
  from tff_algos import training  # pylint: disable=g-import-not-at-top
  from tff_algos.flags import algorithm_flags  # pylint: disable=g-import-not-at-top
  from tff_algos.training import run_dir  # pylint: disable=g-import-not-at-top
  try:
    task = get_task(args.task, options)  # data errors surface before any worker starts
  except BaseException:
    common.remove_empty(created)  # a refused data set leaves no empty root behind
    raise
  args = fit_cohort_to(args, len(task.client_ids), task.name)
  out_dir = trainer_flags.output_dir(args)
  if not args.experiment_name:  # a run of other settings may share the default name
    run_dir.set_flag_names(name='--experiment_name (the default name holds only the task, '
                                'algorithm, optimisers, learning rates, K or E, M and seed)')
  run_dir.check_free(out_dir)  # another run there: refused before any tracing
  with runtime_flags.managed_context():
    algorithm = algorithm_flags.build(args.algorithm, task.model_fn, hp)
    print(f'{algorithm.name} on {task.name} ({task.info.get("model")}, '
          f'{len(task.client_ids)} clients) -> {out_dir}', flush=True)
    result = training.run_training(algorithm, task, trainer_flags.run_config(out_dir, args),
                                   extra_summary={'flags': trainer_flags.flag_values(args)},
                                   identity=trainer_flags.run_identity(args))
  report.print_run_results(out_dir, result.final_eval)
  return 0


if __name__ == '__main__':
  common.run(main)
