"""Flag mistakes that the command line alone shows are refused with one
`error:` line naming the flag, exit status 2 and no traceback, before
TensorFlow loads: they used to surface as tracebacks (status 1) after
TensorFlow and the data had loaded, after a 30 s wait for a worker, as
absl's whole --help, or not at all (a run written into the current directory).
"""

import glob
import math
import os
import subprocess
import sys

import pytest

from binaries import assert_refused, run_binary
from paths import ROOT

# The binaries that start through `common.run` (and so share its checks).
BINARIES = sorted(os.path.basename(p)[:-3]
                  for p in glob.glob(os.path.join(ROOT, 'experiments', '*.py'))
                  if 'common.run(' in open(p).read() and not p.endswith('common.py'))


@pytest.mark.parametrize('binary,argv,fragment', [
    ('train', ['--total_rounds=3', '--workers=0'], 'need at least one worker'),
    ('train', ['--workers=abc'], "expected a worker count or host:port,... ; got 'abc'"),
    ('train', ['--workers=localhost:'], "got 'localhost:'"),
    ('train', ['--workers=localhost:99999'], 'port 99999'),
    ('train', ['--workers=a:1,b:0'], 'port 0'),
    ('grid', ['--grid=seed=0,1', '--workers=0'], 'need at least one worker'),
    ('quadratic_toy', ['--workers=-2'], "got '-2'"),
])
def test_a_bad_workers_value_is_refused_while_the_flags_are_parsed(tmp_path, binary, argv,
                                                                   fragment):
  """--workers was parsed only when the backend started (after TensorFlow and
  the data: a ValueError traceback), and an impossible port waited 30 s for a
  worker; now absl's validator answers it for every binary with the flag."""
  assert_refused(run_binary(binary, *argv, cwd=tmp_path), '--workers', fragment)


def test_check_backend_parses_workers_for_the_cpp_backend_too():
  """`runtime_flags.check` (the binaries' validate) calls `check_backend`,
  which parsed --workers only for --backend=inprocess; with --workers the
  backend is 'cpp', so '0' passed every check."""
  from tff_algos.runtime import backend_options
  for bad in ('0', 'host:0', 'host:65536', 'host:²'):
    with pytest.raises(ValueError, match='--workers'):
      backend_options.check_backend('cpp', bad)
  backend_options.check_backend('cpp', 'host:65535')
  assert backend_options.parse_workers('a:1, b:65535') == ['a:1', 'b:65535']


def test_an_unreachable_worker_is_one_error_line(tmp_path):
  """An address where no worker answers was a RuntimeError traceback (status
  1); it is a user error with its fix. The wait is shortened to 1 s here."""
  import portpicker
  port = portpicker.pick_unused_port()
  res = run_binary('train', '--task=digits', '--model=logistic', '--total_rounds=1',
                   '--noprogress', f'--workers=localhost:{port}',
                   f'--root_output_dir={tmp_path}', cwd=tmp_path,
                   setup='from tff_algos.runtime import context\n'
                         'context.wait_ready.__defaults__ = (1.0,)', timeout=300)
  assert_refused(res, f'no TFF worker answers at localhost:{port}',
                 'python -m tff_algos.runtime.worker --port=PORT',
                 before_tensorflow=False)


@pytest.mark.parametrize('alpha', ['0', '-1', 'nan', 'inf'])
def test_a_bad_dirichlet_alpha_is_refused_before_tensorflow(tmp_path, alpha):
  """--dirichlet_alpha=0 was refused by the split, a traceback after
  TensorFlow and the data loaded (and NaN went through)."""
  res = run_binary('train', '--task=digits', f'--dirichlet_alpha={alpha}',
                   '--total_rounds=3', f'--root_output_dir={tmp_path}', cwd=tmp_path)
  assert_refused(res, '--dirichlet_alpha must be a finite number > 0')
  assert os.listdir(tmp_path) == []


def test_the_dirichlet_splits_refuse_a_nan_or_infinite_alpha():
  """A NaN alpha passed `alpha <= 0` and drew NaN class proportions."""
  import numpy as np
  from tasks import partition
  labels = np.arange(40) % 4
  for alpha in (math.nan, math.inf, 0.0):
    with pytest.raises(ValueError, match='dirichlet alpha must be > 0 and finite'):
      partition.dirichlet_label_split(labels, 4, alpha, seed=0)
    with pytest.raises(ValueError, match='dirichlet alpha must be > 0 and finite'):
      partition.dirichlet_prior_split(labels, np.full(4, 10), alpha, seed=0)


@pytest.mark.parametrize('binary', BINARIES)
def test_a_positional_argument_is_one_error_line(tmp_path, binary):
  """absl answered train's with its whole --help (status 1) and most binaries
  ignored them (`del argv`) and ran; every binary refuses them at once.
  Run in an empty directory, so that a binary that ran writes nothing here."""
  res = run_binary(binary, 'extra_arg', cwd=tmp_path)
  assert_refused(res, "unexpected argument 'extra_arg'", '--name=value')
  assert len(res.stdout.splitlines()) == 1  # the TF line only: no --help text


@pytest.mark.parametrize('binary,argv', [
    ('train', ['--help']), ('train', ['-?']), ('train', ['--helpfull']),
    ('quadratic_toy', ['--help'])])
def test_help_exits_with_status_0(binary, argv):
  """absl's help flags exited with status 1, which scripts read as a failure."""
  res = subprocess.run([sys.executable, '-m', f'experiments.{binary}', *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert res.returncode == 0, res.stderr[-3000:]
  assert '--workers:' in res.stdout and 'error:' not in res.stderr


# Every binary with an output directory flag, and that flag.
OUTPUT_FLAGS = [('train', 'root_output_dir'), ('grid', 'root_output_dir'),
                ('feddyn', 'root_output_dir'), ('fedgbo', 'root_output_dir'),
                ('reproduce', 'root_output_dir'), ('local_update_decay', 'root_output_dir'),
                ('quadratic_toy', 'output_dir'), ('nastya', 'output_dir'),
                ('table6', 'output_dir')]


@pytest.mark.parametrize('binary,flag', OUTPUT_FLAGS)
def test_an_empty_output_directory_flag_is_refused(tmp_path, binary, flag):
  """`--root_output_dir=` wrote the run into the current directory (status 0).
  Run in an empty directory: nothing may be written there."""
  res = run_binary(binary, f'--{flag}=', cwd=tmp_path)
  assert_refused(res, f'--{flag} is empty')
  assert os.listdir(tmp_path) == []


def test_an_unusable_root_output_dir_is_refused_before_tensorflow(tmp_path):
  """train checked --root_output_dir only after TensorFlow and the data loaded
  (seconds); it is checked right after the flags, before TensorFlow, and only
  after them: a bad flag leaves no new root directory behind."""
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  for root in (blocker, blocker / 'out', '/proc/no_such_dir'):
    res = run_binary('train', '--task=digits', '--total_rounds=3', f'--root_output_dir={root}',
                     cwd=tmp_path)
    assert_refused(res, 'cannot use the output directory', '--root_output_dir')
  res = run_binary('train', '--task=digits', '--clients_per_round=31',
                   f'--root_output_dir={tmp_path / "new"}', cwd=tmp_path)
  assert_refused(res, '--clients_per_round=30 or less')
  assert not (tmp_path / 'new').exists()


@pytest.mark.parametrize('task', ['digits', 'quadratic', 'feddyn_digits', 'mnist'])
def test_use_synthetic_data_on_a_task_without_a_stand_in_is_refused(tmp_path, task):
  """--use_synthetic_data was ignored without a word by the tasks that have no
  synthetic stand-in (the run trained on the real or embedded data)."""
  res = run_binary('train', f'--task={task}', '--use_synthetic_data', '--total_rounds=2',
                   cwd=tmp_path)
  assert_refused(res, '--use_synthetic_data', f"task {task!r} has no synthetic stand-in",
                 'emnist_character', 'drop the flag')
  assert os.listdir(tmp_path) == []


def test_the_tasks_with_a_synthetic_stand_in_are_those_on_tffs_datasets():
  """`TaskSpec.synthetic` where the task's loader reads --use_synthetic_data
  (TFF's `get_synthetic()`, `tasks/tff_data.py`); the trainer's checks pass it."""
  from experiments.lib import flags as trainer_flags
  from tasks import catalog
  readers = {t.name for t in catalog.TASKS if t.synthetic}
  assert readers == {'emnist_character', 'shakespeare_character', 'stackoverflow_tag',
                     'stackoverflow_word', 'cifar100_image', 'shakespeare_003',
                     'emnist_autoencoder'}
  for spec in catalog.TASKS:
    if spec.name in readers:  # its loader goes through TFF's data module
      module = spec.builder_path.split(':')[0]
      assert 'tff_data' in open(os.path.join(ROOT, *module.split('.')) + '.py').read(), spec
  assert 'no synthetic stand-in' in trainer_flags.synthetic_unread('digits')


def test_a_leading_tilde_in_a_path_flag_is_the_home_directory(tmp_path):
  """The shell leaves ~ as it is after '=': --root_output_dir=~/runs wrote the
  run into a directory named '~' under the current one."""
  home, cwd = tmp_path / 'home', tmp_path / 'cwd'
  home.mkdir()
  cwd.mkdir()
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.train', '--root_output_dir=~/runs',
       '--experiment_name=t', '--total_rounds=1', '--clients_per_round=3',
       '--rounds_per_eval=0', '--noprogress'],
      cwd=cwd, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT, HOME=str(home)))
  assert res.returncode == 0, res.stderr[-3000:]
  assert (home / 'runs' / 't' / 'metrics.csv').exists()
  assert os.listdir(cwd) == []
