"""Errors a person can act on: every binary answers a user-fixable problem with
one `error:` line and exit status 2, never a traceback or TFF's
`ServiceManager.__del__` noise; Ctrl-C and SIGTERM say where the run stopped."""

import ast
import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import worker_pids_of
from paths import ROOT


BINARIES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, 'experiments', '*.py'))
                  if '__main__' in open(p).read() and not os.path.basename(p).startswith('_'))
SMALL = ['--task=digits', '--model=logistic', '--clients_per_round=3', '--local_steps=2',
         '--client_batch_size=16', '--rounds_per_eval=0', '--noprogress']


def run(args, timeout=600, **kwargs):
  return subprocess.run([sys.executable, '-m', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT),
                        **kwargs)


def run_code(code: str, timeout=120):
  """`python -c code` from the repository root, as `run` runs a module."""
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))


def assert_one_error_line(res, *fragments):
  """Exit 2, exactly one stderr line starting 'error:', no traceback / TFF noise."""
  assert res.returncode == 2, res.stderr[-3000:]
  errors = [line for line in res.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1, res.stderr[-3000:]
  assert 'Traceback' not in res.stderr and 'ServiceManager' not in res.stderr, res.stderr
  for fragment in fragments:
    assert fragment in errors[0], errors[0]


def test_the_binaries_are_found():
  assert {'train', 'reproduce', 'feddyn', 'fedgbo', 'grid', 'nastya'} <= set(BINARIES)


def test_the_package_lists_its_binaries():
  """`python -m experiments` said only that a package cannot be executed."""
  res = run(['experiments'], timeout=120)
  assert res.returncode == 0 and res.stderr == '', res.stderr
  listed = [line.split()[0] for line in res.stdout.splitlines()[1:-1]]
  assert listed == BINARIES
  assert '  train ' in res.stdout and 'Federated training of one (task, algorithm) pair' in res.stdout


@pytest.mark.parametrize('binary', BINARIES)
def test_an_unparsable_flag_is_one_error_line(binary):
  res = run([f'experiments.{binary}', '--no_such_flag=1'], timeout=120)
  assert_one_error_line(res, 'no_such_flag', 'see --help')


@pytest.mark.parametrize('binary', BINARIES)
def test_help_lists_the_binarys_flags_and_no_tff_noise(binary):
  res = run([f'experiments.{binary}', '--help'], timeout=120)
  out = res.stdout + res.stderr
  assert 'ServiceManager' not in out and 'Traceback' not in out
  own = re.findall(r"^flags\.DEFINE_\w+\(\s*'(\w+)'",
                   open(os.path.join(ROOT, 'experiments', f'{binary}.py')).read(), re.M)
  for name in own:
    assert f'--{name}:' in out or f'--[no]{name}:' in out, name
  source = open(os.path.join(ROOT, 'experiments', f'{binary}.py')).read()
  if 'trainer_flags' in source:  # the trainer's flags are the binary's too
    for name in ('client_learning_rate', 'total_rounds', 'max_rounds_all_dropped'):
      assert f'--{name}:' in out, name
  if 'runtime_flags' in source:
    assert '--backend:' in out


def test_train_help_shows_the_trainer_flags_with_their_help():
  res = run(['experiments.train', '--help'], timeout=120)
  for text in ('--client_learning_rate: Client learning rate',
               '--max_rounds_all_dropped: Stop the run after', '--backend:', '--list_tasks'):
    assert text in res.stdout, text


@pytest.mark.parametrize('binary', BINARIES)
def test_docstring_examples_name_existing_experiments(binary):
  from experiments import configs
  doc = ast.get_docstring(ast.parse(open(os.path.join(ROOT, 'experiments', f'{binary}.py')).read()))
  names = re.findall(r'--experiment=(\w+)', doc or '')
  known = configs.all_experiments()
  assert [n for n in names if n not in known] == []


def test_help_examples_keep_their_line_continuations():
  res = run(['experiments.reproduce', '--help'], timeout=120)
  assert '--scale=full \\\n' in res.stdout


@pytest.mark.parametrize('flag,fragment', [
    ('--experiment_name=a/b', '--experiment_name'), ('--task=nope', '--task'),
    ('--algorithm=fedfoo', '--algorithm'),
    ('--algorithm=fedavg --local_steps_decay=0.9', 'local_steps_decay needs local_steps'),
    ('--algorithm=fedgbo --clip_norm=1', '--clip_norm is not used by fedgbo'),
    ('--total_rounds=-1', 'total_rounds must be >= 1'),
    ('--concurrent_clients=0', '--concurrent_clients must be a positive integer'),
    ('--compile_local_loop --backend=cpp',
     '--compile_local_loop runs on the in-process backend only'),
    ('--task=digits --model=nosuchmodel', "has no model 'nosuchmodel'"),
    ('--local_steps=0', '--local_steps must be >= 1, got 0'),
    ('--algorithm=fedsgd --client_learning_rate=0.3',
     'fedsgd does not use --client_learning_rate'),
])
def test_a_bad_flag_value_is_answered_before_tensorflow_loads(tmp_path, flag, fragment):
  argv = ', '.join(f'"{f}"' for f in flag.split())
  code = (f'import sys; sys.argv = ["train", {argv}]\n'
          'from experiments import train\nfrom experiments.lib import common\n'
          'try:\n  common.run(train.main)\n'
          'finally:\n  print("TF loaded:", "tensorflow" in sys.modules)\n')
  res = run_code(code)
  assert_one_error_line(res, fragment)
  assert 'TF loaded: False' in res.stdout


@pytest.mark.parametrize('flag,fragment', [
    ('--task=nope', 'flag --task=nope: value should be one of'),
    ('--algorithm=fedavg --local_steps_decay=0.9', 'local_steps_decay needs local_steps'),
    ('--clients_per_round=31', 'set --clients_per_round=30 or less'),
])
def test_bad_trainer_flags_are_one_error_line(tmp_path, flag, fragment):
  res = run(['experiments.train', f'--root_output_dir={tmp_path}', '--noprogress',
             *flag.split()])
  assert_one_error_line(res, fragment)


# Every binary that writes files, its output flag and the least it needs to start
# (the paper binaries, which check it as the trainer does, under -m slow).
_SLOW = pytest.mark.slow
OUTPUT_FLAGS = [
    ('train', 'root_output_dir', []), ('grid', 'root_output_dir', ['--grid=seed=0,1']),
    pytest.param('feddyn', 'root_output_dir', [], marks=_SLOW),
    pytest.param('fedgbo', 'root_output_dir', [], marks=_SLOW),
    ('quadratic_toy', 'output_dir', []), pytest.param('nastya', 'output_dir', [], marks=_SLOW),
    pytest.param('table6', 'output_dir', [], marks=_SLOW),
    pytest.param('local_update_decay', 'root_output_dir', [], marks=_SLOW),
    ('reproduce', 'root_output_dir', ['--experiment=nastya_mushrooms_fig2']),
    ('reproduce', 'root_output_dir', ['--report'])]


@pytest.mark.parametrize('binary,flag,extra', OUTPUT_FLAGS,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_an_unusable_output_directory_is_refused_before_the_work(tmp_path, binary, flag,
                                                                  extra):
  """A directory that cannot be made (a path under a file) is one error line
  naming the flag, in seconds: quadratic_toy, nastya and reproduce wrote their
  outputs only after training, and then failed with a traceback."""
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  start = time.monotonic()
  res = run([f'experiments.{binary}', f'--{flag}={blocker}/out', *extra])
  assert_one_error_line(res, 'cannot use the output directory', f'--{flag}')
  assert time.monotonic() - start < 60  # no training ran (a run takes minutes)


def test_missing_dataset_is_one_error_line_naming_the_file(tmp_path):
  res = run(['experiments.train', '--task=emnist_character', f'--cache_dir={tmp_path}',
             f'--root_output_dir={tmp_path}', '--noprogress'])
  # The fix on the same line: where to get the file, and how to run without it.
  assert_one_error_line(res, 'emnist_all.sqlite', str(tmp_path),
                        'download https://storage.googleapis.com/', '--use_synthetic_data')
  assert len([line for line in res.stderr.splitlines() if 'emnist_all' in line]) == 1


def test_reproduce_without_the_data_offers_its_own_offline_run(tmp_path):
  """The missing-file message names the file; from reproduce, which has no
  --use_synthetic_data, its offline way is --scale=smoke."""
  root = tmp_path / 'runs'
  res = run(['experiments.reproduce', '--experiment=fedopt_baselines_emnist_cr_fedavg',
             '--scale=full', f'--cache_dir={tmp_path}', f'--root_output_dir={root}'])
  assert_one_error_line(res, 'emnist_all.sqlite', str(tmp_path), '--scale=smoke')
  assert '--use_synthetic_data' not in res.stderr
  assert not root.exists()  # no empty runs/full/<experiment> left behind


def test_malformed_libsvm_file_is_one_error_line_naming_the_line(tmp_path):
  path = tmp_path / 'bad.libsvm'
  path.write_text('1 1:0.5 2:0.25\n-1 this is not libsvm\n')
  res = run(['experiments.train', '--task=logistic', f'--libsvm_path={path}',
             f'--root_output_dir={tmp_path}', '--noprogress'])
  assert_one_error_line(res, f'{path}:2')


@pytest.mark.slow
def test_checkpoint_past_total_rounds_is_one_error_line(tmp_path):
  args = ['experiments.train', *SMALL, f'--root_output_dir={tmp_path}',
          '--experiment_name=run', '--rounds_per_checkpoint=1']
  first = run([*args, '--total_rounds=2'])
  assert first.returncode == 0, first.stderr[-3000:]
  again = run([*args, '--total_rounds=1'])
  assert_one_error_line(again, 'total_rounds')
  resumed = run([*args, '--total_rounds=3'])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'resuming from round 2' in resumed.stdout
  assert 'ServiceManager' not in resumed.stderr


def test_reproduce_list_and_report_leave_no_tff_noise(tmp_path):
  # A report needs a result to report (an empty root is refused, test_reproduce).
  result = tmp_path / 'smoke' / 'nastya_mushrooms_fig2' / 'result.json'
  result.parent.mkdir(parents=True)
  result.write_text(json.dumps({'measured': {}, 'rounds': {}}))
  for flag in ('--list', '--report'):
    res = run(['experiments.reproduce', flag, f'--root_output_dir={tmp_path}'])
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'ServiceManager' not in res.stderr and 'Traceback' not in res.stderr


@pytest.mark.slow
def test_use_synthetic_data_runs_with_the_default_cohort(tmp_path):
  res = run(['experiments.train', '--task=emnist_character', '--use_synthetic_data',
             '--total_rounds=1', '--local_steps=1', f'--root_output_dir={tmp_path}',
             '--noprogress'])
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'using --clients_per_round=' in res.stderr
  assert 'ServiceManager' not in res.stderr


@pytest.mark.slow
def test_every_client_diverging_warns_reports_nan_and_stops(tmp_path):
  res = run(['experiments.train', '--task=feddyn_digits', '--algorithm=feddyn',
             '--client_learning_rate=1e6', '--local_steps=5', '--total_rounds=6',
             '--max_rounds_all_dropped=3', '--clients_per_round=3', '--noprogress',
             f'--root_output_dir={tmp_path}', '--experiment_name=div'])
  assert_one_error_line(res, 'every client diverged in each of the last 3 rounds')
  warnings = [l for l in res.stderr.splitlines() if l.startswith('warning: round')]
  assert len(warnings) == 3, res.stderr
  rows = open(tmp_path / 'div' / 'metrics.csv').read().splitlines()
  header = rows[0].split(',')
  assert 'client_work/non_finite_clients' in header and 'client_work/finite_clients' not in header
  loss = header.index('client_work/train/loss')
  assert [r.split(',')[loss] for r in rows[1:]] == ['nan'] * 3


def _stopped_lines(err: str) -> list[str]:
  """stderr's lines, less blank ones and TensorFlow's timestamped log lines."""
  return [l for l in err.splitlines() if l.strip() and not l.startswith('20')]


LONG_CALL = textwrap.dedent('''
    from experiments.lib import common

    def main(argv):
      import tensorflow as tf
      import tensorflow_federated as tff
      from tff_algos import runtime
      with runtime.managed_context(backend='inprocess'):
        @tff.tensorflow.computation(tf.float32)
        def long_call(x):  # ~10 s and more: still running when the signal comes
          m = tf.fill([300, 300], x)
          _, m = tf.while_loop(lambda i, m: i < 50000,
                               lambda i, m: (i + 1, tf.tanh(tf.matmul(m, m) * 1e-3)), (0, m))
          return tf.reduce_sum(m)
        print('CALLING', flush=True)  # a first call: TFF's event-loop thread runs it
        long_call(1.0)
      return 0

    common.run(main)
''')


@pytest.mark.parametrize('sig,status', [
    (signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)])
def test_a_signal_during_a_call_on_tffs_loop_thread_exits_cleanly(sig, status):
  # The signal stops the waiting main thread; the call goes on on TFF's loop
  # thread, and tearing the interpreter down under it crashed (SIGSEGV: -11).
  proc = subprocess.Popen([sys.executable, '-c', LONG_CALL], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == 'CALLING', proc.communicate()[1][-3000:]
  time.sleep(1.0)
  sent = time.monotonic()
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == status, err[-3000:]
  assert time.monotonic() - sent < 15.0  # not after the call, which runs far longer
  lines = _stopped_lines(err)
  assert lines == ['stopped; rerun the same command to resume'], err[-3000:]


SIGNALS_ON_THE_WAY_OUT = textwrap.dedent('''
    import os, signal
    from experiments.lib import common

    def main(argv):
      from tff_algos import training
      try:
        raise training.Stopped('stopped after round 3; rerun the same command to resume')
      finally:
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while the run unwinds

    try:
      common.run(main)
    finally:
      os.kill(os.getpid(), signal.SIGINT)  # a third once the line is out
''')


def test_more_signals_on_the_way_out_keep_the_line_and_print_no_traceback():
  proc = run_code(SIGNALS_ON_THE_WAY_OUT)
  lines = _stopped_lines(proc.stderr)
  assert lines == ['stopped after round 3; rerun the same command to resume'], proc.stderr
  assert proc.returncode == -signal.SIGINT  # ended as SIGINT ends a process (130 in a shell)


A_FINISHED_RUN = textwrap.dedent('''
    import atexit, threading, time
    from experiments.lib import common

    class TornDown:
      def __del__(self):
        print('torn down', flush=True)

    kept = TornDown()  # module teardown would collect it

    def main(argv):
      import tensorflow  # a finished run that loaded TensorFlow: no teardown
      atexit.register(lambda: print('atexit ran', flush=True))
      threading.Thread(target=lambda: (time.sleep(0.5), print('thread done', flush=True))).start()
      print('main done', flush=True)
      return 0

    common.run(main)
''')


def test_a_finished_run_exits_with_its_threads_and_exit_functions_but_no_teardown():
  res = run_code(A_FINISHED_RUN)
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.split('\n') == ['main done', 'thread done', 'atexit ran', ''], res.stdout
  assert _stopped_lines(res.stderr) == [], res.stderr


A_CLOSED_PIPE = textwrap.dedent('''
    from experiments.lib import common

    def main(argv):
      for _ in range(100000):
        print('a row of the run', flush=True)  # its reader stops after one line
      return 0

    common.run(main)
''')


def test_a_closed_output_pipe_ends_the_run_with_one_line():
  """`train ... | head`: the reader goes away; the binary ends as SIGPIPE ends
  a process (status 141), saying so in one line, without a traceback."""
  proc = subprocess.Popen([sys.executable, '-c', A_CLOSED_PIPE], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == 'a row of the run\n'
  proc.stdout.close()
  err = proc.stderr.read()
  assert proc.wait(timeout=60) == 128 + signal.SIGPIPE, err
  assert _stopped_lines(err) == [
      'stopped: the output pipe was closed; rerun the same command to resume'], err


def _start(tmp_path, *extra):
  return subprocess.Popen(
      [sys.executable, '-m', 'experiments.train', *SMALL, '--total_rounds=400',
       '--rounds_per_checkpoint=1', f'--root_output_dir={tmp_path}', '--experiment_name=run',
       *extra], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def _wait_for_rows(path, n, proc, timeout=300):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    if os.path.exists(path) and sum(1 for _ in open(path)) - 1 >= n:
      return
    time.sleep(0.2)
  raise AssertionError('no progress')


@pytest.mark.parametrize('sig,status', [
    (signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)])
def test_a_signal_stops_with_one_line_and_the_rerun_resumes(tmp_path, sig, status):
  proc = _start(tmp_path)
  _wait_for_rows(tmp_path / 'run' / 'metrics.csv', 3, proc)
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == status, err[-3000:]
  lines = _stopped_lines(err)
  assert len(lines) == 1 and re.fullmatch(
      r'stopped after round \d+; rerun the same command to resume.*', lines[0]), err
  assert 'Traceback' not in err and 'ServiceManager' not in err
  if sig == signal.SIGTERM:
    return
  resumed = run(['experiments.train', *SMALL, '--total_rounds=5', '--rounds_per_checkpoint=1',
                 f'--root_output_dir={tmp_path}', '--experiment_name=run'])
  # The resume starts at the checkpoint the line names, else at its round.
  stop = re.match(r'stopped after round (\d+)(?:.*from its checkpoint of round (\d+))?',
                  lines[0])
  start = int(stop.group(2) or stop.group(1))
  # A signal during a checkpoint's write waits for it: nothing is cut short.
  assert 'corrupt' not in resumed.stderr and 'cut short' not in resumed.stderr, resumed.stderr
  if start > 5:
    assert resumed.returncode == 2, resumed.stderr  # checkpoint past --total_rounds=5
  else:
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f'resuming from round {start} ' in resumed.stdout


@pytest.mark.slow
def test_a_dead_worker_is_one_error_line(tmp_path):
  import psutil
  proc = _start(tmp_path, '--backend=cpp')
  _wait_for_rows(tmp_path / 'run' / 'metrics.csv', 2, proc)
  workers = [psutil.Process(pid) for pid in worker_pids_of(proc.pid)]
  assert workers
  for w in workers:
    w.kill()
  _, err = proc.communicate(timeout=180)
  res = subprocess.CompletedProcess(proc.args, proc.returncode, '', err)
  assert_one_error_line(res, 'worker_binary', 'rerun the same command')


def test_user_fixable_failures_are_user_errors():
  from experiments.lib import flags as trainer_flags
  from tasks import TaskError
  from tff_algos import runtime
  from tff_algos.errors import UserError
  for error in (trainer_flags.FlagError, TaskError, runtime.WorkerStopped):
    assert issubclass(error, UserError), error


def test_training_table_says_which_columns_are_per_round_and_which_cumulative():
  from experiments import report
  rows = [{'round': r, 'client_work/train/loss': 1.0 / r, 'client_work/client_steps': 5.0,
           'upload_bytes': 2e6, 'round_time_s': 0.5, 'eval/accuracy': 0.1 * r}
          for r in (1, 2)]
  lines = report.training_table(rows).splitlines()
  assert lines[0].split() == ['round', 'round_train_loss', 'eval_accuracy',
                              'cum_client_steps', 'cum_upload_MB', 'round_time_s']
  assert lines[3].split() == ['2', '0.5000', '0.2000', '10', '4.0000', '0.5000']
  assert lines[-1].startswith('round_*: that round alone') and 'cum_*: rounds 1 to' in lines[-1]



def test_a_task_without_evaluations_still_shows_its_train_loss(tmp_path, capsys):
  """The quadratic toy has no test set: its table printed a header and no row,
  and `final eval:` nothing, so a 20-round run showed no number at all."""
  from experiments import report
  rows = [{'round': r, 'client_work/train/loss': -0.01 * r, 'client_work/client_steps': 10.0,
           'upload_bytes': 240.0, 'round_time_s': 0.005} for r in range(1, 24)]
  lines = report.training_table(rows).splitlines()
  shown = [int(line.split()[0]) for line in lines[2:-1]]
  assert shown == [3, 6, 9, 12, 15, 18, 21, 23]  # every ceil(23 / 10) = 3rd, and the last
  assert lines[-2].split()[:3] == ['23', '-0.2300', '230']
  report.print_run_results(str(tmp_path), {})
  assert 'final eval: none (this task has no evaluation set)' in capsys.readouterr().out

ANOTHER_BROKEN_PIPE = textwrap.dedent('''
    import os
    from experiments.lib import common

    def main(argv):
      r, w = os.pipe()
      os.close(r)  # a worker's pipe, say: stdout is fine
      os.write(w, b'x')
      return 0

    common.run(main)
''')


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback():
  res = run_code(ANOTHER_BROKEN_PIPE)
  assert res.returncode == 1 and 'BrokenPipeError' in res.stderr, res.stderr
  assert 'Traceback' in res.stderr
  assert 'output pipe was closed' not in res.stderr


def _run_dir(path, rows, final_eval=None):
  import csv
  path.mkdir(parents=True)
  with open(path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  if final_eval is not None:
    (path / 'summary.json').write_text(json.dumps({'final_eval': final_eval}))
  return str(path)


def test_report_as_a_binary_prints_a_runs_table_again_without_tensorflow(tmp_path):
  """`python -m experiments.report` did nothing and exited 0."""
  rows = [{'round': r, 'client_work/train/loss': 1.0 / r, 'client_work/client_steps': 5.0,
           'upload_bytes': 2e6, 'round_time_s': 0.5, 'eval/accuracy': 0.25 * r}
          for r in (1, 2)]
  done = _run_dir(tmp_path / 'done', rows, {'accuracy': 0.5, 'num_examples': 100.0})
  stopped = _run_dir(tmp_path / 'stopped', rows[:1])
  # The binary as `python -m` runs it, saying at exit whether TensorFlow loaded.
  code = ('import atexit, runpy, sys; sys.argv[0] = "report"; atexit.register(lambda: '
          'print("TF" if "tensorflow" in sys.modules else "noTF")); '
          'runpy.run_module("experiments.report", run_name="__main__")')
  result = subprocess.run([sys.executable, '-c', code, f'--run_dirs={done},{stopped}'],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert out.rstrip().endswith('noTF')
  assert f'== {done}' in out and f'== {stopped}' in out
  assert 'final eval: accuracy=0.5000' in out and 'num_examples' not in out.split('== ')[1]
  assert 'none yet (no summary.json: the run has not finished' in out
  assert (tmp_path / 'done' / 'curves.png').exists()
  for argv, message in (([], '--run_dirs is empty'),
                        ([f'--run_dirs={tmp_path}'], 'holds no metrics.csv or summary.json')):
    result = run(['experiments.report', *argv], timeout=120)
    assert_one_error_line(result, message)


def test_seed_stats_as_a_binary_says_whether_a_published_value_lies_in_the_interval():
  """`python -m experiments.seed_stats` did nothing and exited 0."""
  def stats(*argv):
    return run(['experiments.seed_stats', *argv], timeout=120)
  result = stats('--values=1,2,3', '--published=2.5')
  assert result.returncode == 0, result.stderr
  half = 4.302653 / math.sqrt(3)  # t_{0.975, 2} s / sqrt(n), s = 1
  assert result.stdout.strip() == (f'n=3 mean=2 std=1 ci95=[{2 - half:.6g}, {2 + half:.6g}] '
                                   'published=2.5 inside=yes')
  assert stats('--values=1,2,3', '--published=9').stdout.strip().endswith('inside=no')
  assert 'one value: no spread' in stats('--values=0.5').stdout
  for argv, message in (((), '--values is empty'), (('--values=1,x',), "'x' is not a number"),
                        (('--values=1', '--published=nan'), '--published must be a finite')):
    assert_one_error_line(stats(*argv), message)


def test_more_clients_than_a_split_can_fill_is_one_error_line(tmp_path):
  """digits split over more clients than it has examples (or than any Dirichlet
  draw fills) ended in a ValueError or RuntimeError traceback."""
  res = run(['experiments.train', '--num_clients=5000', '--clients_per_round=3',
             f'--root_output_dir={tmp_path}', '--noprogress'], timeout=300)
  assert_one_error_line(res, '5000 clients x 1 examples exceeds', 'lower --num_clients')
  assert os.listdir(tmp_path) == []
  from tasks import base, partition
  with pytest.raises(base.TaskError, match='raise --dirichlet_alpha'):
    partition.dirichlet_label_split([0] * 30 + [1] * 30, 50, 0.01, seed=0, max_tries=3)


def test_a_default_name_shared_by_other_settings_says_what_it_holds(tmp_path):
  """Two runs differing in a setting the default name leaves out (the batch
  size) meet in one directory; the refusal advised --restart, which deleted
  the first run, without saying why the names clashed."""
  argv = ['experiments.train', *SMALL, '--total_rounds=1', f'--root_output_dir={tmp_path}']
  assert run(argv).returncode == 0
  res = run([*argv, '--client_batch_size=8'])
  assert_one_error_line(res, 'holds a different run (differs in: client_batch_size (16 there, '
                        '8 here))',
                        'choose another --experiment_name (the default name holds only',
                        'pass --restart to delete its outputs and start the run over')
