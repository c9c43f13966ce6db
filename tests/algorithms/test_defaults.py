"""Every algorithm as `python -m experiments.train --algorithm=<name>` runs it
with no other flag: it learns the default task, and its run records the
settings that ran."""

import contextlib

import pytest

from tff_algos.algorithms import registry

ROUNDS = 5
# Learning is a drop of at least this fraction of the initial eval loss (K-MAML
# at eta = 1 ends 0.1% below it).
MIN_DROP = 0.01


@contextlib.contextmanager
def trainer_flags_parsed(*argv):
  """The trainer's flags parsed from `argv` (as `python -m experiments.train
  argv`), unparsed again on exit."""
  from absl import flags
  import experiments.train  # noqa: F401  (the binary's flags, all of them)
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', *argv])
    yield
  finally:
    flags.FLAGS.unparse_flags()


@pytest.fixture(scope='module')
def default_runs():
  """name -> what the trainer makes of `--algorithm=<name>` alone (its
  `TrainerArgs`, `TaskOptions` and `HParams`), with --total_rounds=ROUNDS."""
  from experiments.lib import flags as trainer_flags
  out = {}
  with trainer_flags_parsed():
    for name in registry.ALGORITHMS:
      args = trainer_flags.TrainerArgs.from_flags().override(
          algorithm=name, total_rounds=ROUNDS, progress=False)
      options, hp, _ = trainer_flags.validate(args=args)
      out[name] = (args, options, hp)
  return out


@pytest.fixture(scope='module')
def default_runtime():
  """The trainer's default backend (in-process) as a context to install, and
  whether its algorithms compile their local loops (`runtime_flags.managed_context`)."""
  from experiments.lib import runtime_flags
  from tff_algos import runtime
  with trainer_flags_parsed():
    backend, workers = runtime_flags.backend(), runtime_flags.workers()
    lanes, compiled = runtime_flags.concurrent_clients(), runtime_flags.compile_local_loop()
  assert backend == 'inprocess'
  ctx = runtime.ManagedContext(backend=backend, workers=workers, concurrent_clients=lanes)
  yield ctx.context, compiled
  ctx.close()


@pytest.fixture(scope='module')
def default_task(default_runs):
  """The trainer's default task at its default options, and the eval loss of
  the seeded initial model that every run starts from."""
  from experiments import train
  from tasks import get_task
  from tff_algos.training import evaluation, initial_weights
  args, options, _ = default_runs['fedavg']
  task = get_task(args.task, options)
  assert train.fit_cohort_to(args, len(task.client_ids), task.name) == args
  start = initial_weights.initial_model_weights(task, args.seed)
  return task, evaluation.cached_evaluator(task)(start, full=True)['loss']


@pytest.mark.parametrize('name', list(registry.ALGORITHMS))
def test_every_algorithm_lowers_the_default_tasks_eval_loss_at_its_defaults(
    name, default_runs, default_task, default_runtime):
  """At its defaults, the algorithm lowers the eval loss of the default task
  (digits, MLP, 30 clients, M = 10) by MIN_DROP or more in ROUNDS rounds (the LocalUpdate
  family at eta = 1, server SGD on sum_k theta_k g_k, fails it: its loss
  rises from 2.3 to 13, K-MAML's stays at 2.31)."""
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from experiments.lib import flags as trainer_flags
  from tff_algos import training
  from tff_algos.core import local_training
  from tff_algos.flags import algorithm_flags
  args, _, hp = default_runs[name]
  task, initial_loss = default_task
  context, compiled = default_runtime
  with context_stack_impl.context_stack.install(context), \
       local_training.compiled_loops(compiled):
    algorithm = algorithm_flags.build(name, task.model_fn, hp)
    result = training.run_training(algorithm, task, trainer_flags.run_config(None, args))
  assert result.final_eval['loss'] < (1 - MIN_DROP) * initial_loss, (
      name, initial_loss, result.final_eval)


@pytest.mark.parametrize('argv,theta', [
    *(((f'--algorithm={name}',), name) for name in ('reptile', 'fomaml', 'kmaml',
                                                    'minibatch_sgd')),
    (('--algorithm=local_update',), 'reptile'),
    (('--algorithm=local_update', '--theta=1,0,2'), '1,0,2')])
def test_the_run_records_the_theta_that_ran(argv, theta):
  """summary.json's flags say the Theta that ran: a preset's own (kmaml's is
  kmaml), not the --theta flag's default, which the presets do not read."""
  from experiments.lib import flags as trainer_flags
  with trainer_flags_parsed(*argv):
    recorded = trainer_flags.flag_values()
  assert (recorded['theta'], recorded['local_steps']) == (theta, 10)
