"""The quiet TensorFlow import (`runtime.quiet_tensorflow`): TensorFlow's three
harmless import errors are dropped, every other line kept in order."""

import os
import signal
import subprocess
import sys

import pytest

from paths import ROOT


_NOISY = """
import os, sys, threading
from tff_algos.runtime import quiet_tensorflow
def noisy():
  for line in (b'first\\n', b'2026-11-29 E cuda_dnn.cc:9342] Unable to register cuDNN factory: '
               b'Attempting to register factory for plugin cuDNN when one has already '
               b'been registered\\n', b'a real error\\n', b'no newline at the end'):
    os.write(2, line)
  return 7
if sys.argv[1] == 'thread':  # a fork would copy only this thread: not filtered
  threading.Thread(target=threading.Event().wait, daemon=True).start()
lingering = []
def started_a_process():  # which holds a copy of the pipe (fd 2) for 60 s
  import subprocess, time
  lingering.append(subprocess.Popen(['sleep', '60']))
  return noisy()
import time
t0 = time.monotonic()
assert quiet_tensorflow._filtered_stderr(
    started_a_process if sys.argv[1] == 'lingering' else noisy) == 7
assert time.monotonic() - t0 < 20, 'waited for the lingering process'
for p in lingering:
  p.kill()
os.write(2, b'|after')
"""


@pytest.mark.parametrize('case', ['plain', 'lingering', 'thread'])
def test_filtered_stderr_drops_only_tensorflows_harmless_factory_lines(case):
  """Every line but the harmless one, in order, before what comes next; a
  process started during the import that keeps the pipe open does not hold
  the import up (the wait is bounded); with threads, no fork and no filter."""
  res = subprocess.run([sys.executable, '-c', _NOISY, case], cwd=ROOT, capture_output=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert res.returncode == 0, res.stderr
  kept = b'first\na real error\nno newline at the end'
  if case == 'plain':
    assert res.stderr == kept + b'|after'
  elif case == 'lingering':  # the filter goes on by itself: its lines may come after
    assert res.stderr.replace(b'|after', b'') == kept, res.stderr
  else:
    assert b'Unable to register' in res.stderr and res.stderr.endswith(b'|after')


def test_filtered_stderr_keeps_the_last_words_of_a_crash():
  """The filter is a process of its own that reads to the end: a process that
  aborts during the filtered import still gets its error out."""
  code = ('import os; from tff_algos.runtime import quiet_tensorflow; '
          'quiet_tensorflow._filtered_stderr(lambda: '
          '(os.write(2, b"fatal: the last words\\n"), os.abort()))')
  res = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), text=True, timeout=120)
  assert res.returncode == -signal.SIGABRT and 'fatal: the last words' in res.stderr, res


def test_importing_tensorflow_under_a_binary_prints_no_factory_errors():
  """TF 2.14 prints three 'Unable to register cuDNN/cuFFT/cuBLAS factory'
  ERROR lines on every import (tensorflow/tensorflow#62075); the binaries
  take them out, and TF_CPP_MIN_LOG_LEVEL=0 keeps them."""
  code = 'import experiments, tensorflow as tf; print(int(tf.constant(2) + 1))'
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  env['PYTHONPATH'] = ROOT
  quiet = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
  assert quiet.returncode == 0 and quiet.stdout == '3\n', quiet.stderr[-3000:]
  assert 'Unable to register' not in quiet.stderr, quiet.stderr
  loud = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        env=dict(env, TF_CPP_MIN_LOG_LEVEL='0'),
                        capture_output=True, text=True, timeout=300)
  assert loud.returncode == 0 and loud.stdout == '3\n', loud.stderr[-3000:]
  assert loud.stderr.count('Unable to register') == 3, loud.stderr
