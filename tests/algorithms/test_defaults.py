"""Every algorithm as `python -m experiments.train --algorithm=<name>` runs it:
its run records the settings that ran."""

import contextlib

import pytest


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
