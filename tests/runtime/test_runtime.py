"""The TFF worker never outlives its Python process."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from conftest import wait_dead, worker_pids_of
from paths import ROOT


# A child with a managed worker and one computation on it.
PRELUDE = textwrap.dedent('''
    import signal, sys, time
    import tensorflow as tf, tensorflow_federated as tff
    from tff_algos import runtime
    from tff_algos.runtime import context
    ctx = runtime.install()

    @tff.tensorflow.computation(tf.int32)
    def add_one(x):
      return x + 1

    assert add_one(1) == 2
''')

SCRIPT = PRELUDE + textwrap.dedent('''
    print('READY', *ctx.pids, flush=True)
    sys.stdin.readline()  # the test reads our worker's pid, then lets us go on
    mode = sys.argv[1]
    if mode == 'raise':
      raise RuntimeError('boom')
    if mode == 'wait':
      time.sleep(600)
''')


def start(mode):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.Popen([sys.executable, '-c', SCRIPT, mode], cwd=ROOT, env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  while line and 'READY' not in line:
    line = proc.stdout.readline()
  workers = [int(p) for p in line.split()[1:]]
  assert workers == worker_pids_of(proc.pid)  # the reported pid is our child
  proc.stdin.write('go\n')
  proc.stdin.flush()
  return proc, workers


@pytest.mark.parametrize('mode', ['exit', 'raise'])
def test_worker_stops_on_normal_exit_and_on_exception(mode):
  proc, workers = start(mode)
  assert len(workers) == 1, 'expected the managed worker to be running'
  out, err = proc.communicate(timeout=60)
  assert (proc.returncode == 0) == (mode == 'exit')
  assert wait_dead(workers) == []
  assert 'NoneType' not in err  # TFF's __del__ traceback no longer shows up


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_worker_stops_when_process_is_signalled(sig):
  proc, workers = start('wait')
  assert len(workers) == 1
  time.sleep(0.5)  # let it reach its sleep
  proc.send_signal(sig)
  proc.communicate(timeout=60)
  assert proc.returncode != 0
  # SIGKILL cannot be handled: the kernel's parent-death signal stops the worker.
  assert wait_dead(workers) == []


def test_in_process_shutdown_stops_the_worker_and_install_starts_a_new_one():
  import tensorflow as tf
  import tensorflow_federated as tff
  from tff_algos import runtime
  ctx = runtime.install()
  assert runtime.install() is ctx  # idempotent while running
  old = list(ctx.pids)
  runtime.shutdown()
  assert wait_dead(old) == []
  new = runtime.install()  # leave a live context for the rest of the session
  assert new is not ctx and set(new.pids).isdisjoint(old)

  @tff.tensorflow.computation(tf.int32)
  def double(x):
    return 2 * x

  assert double(21) == 42


# Prints INTERRUPTED if a signal shut the context down (its exception swallowed or not).
REPORT_INTERRUPTED = textwrap.dedent('''
    try:
      runtime.raise_if_interrupted()
    except KeyboardInterrupt:
      print('INTERRUPTED', flush=True)
''')

SWALLOWED = PRELUDE + textwrap.dedent('''
    print('WORKERS', *ctx.pids, flush=True)
    try:  # the handler, with its KeyboardInterrupt swallowed (as in a weakref callback)
      context.on_signal(signal.SIGINT, None)
    except KeyboardInterrupt:
      pass
    t = time.monotonic()
    try:
      add_one(1)
      print('CALL RETURNED', flush=True)
    except runtime.WorkerStopped:
      print('STOPPED AFTER', round(time.monotonic() - t, 1), flush=True)
''') + REPORT_INTERRUPTED


def _run_script(script: str) -> subprocess.CompletedProcess:
  """`script` in a new Python (TensorFlow's C++ logging off), its output captured."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  return subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


def test_a_call_after_a_swallowed_sigint_fails_at_once_instead_of_hanging():
  # TFF alone retries a call against a stopped worker for ever.
  proc = _run_script(SWALLOWED)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  workers = [int(p) for p in next(l for l in lines if l.startswith('WORKERS')).split()[1:]]
  assert wait_dead(workers) == []
  stopped = [l for l in lines if l.startswith('STOPPED AFTER')]
  assert stopped and float(stopped[0].split()[-1]) < 5.0, proc.stdout
  assert 'INTERRUPTED' in lines


IN_A_CALLBACK = PRELUDE + textwrap.dedent('''
    import weakref

    class Thing:
      pass

    def collect(callback):
      thing = Thing()
      ref = weakref.ref(thing, callback)
      del thing  # the callback runs here; what it raises Python cannot raise

    def boom(_):
      raise ValueError('not ours')

    collect(boom)  # still reported
    collect(lambda _: signal.raise_signal(signal.SIGINT))  # the handler runs in the callback
''') + REPORT_INTERRUPTED


def test_a_sigint_swallowed_in_a_weakref_callback_prints_nothing_and_stops_the_run():
  # The run stops between rounds (raise_if_interrupted); without the hook Python
  # printed "Exception ignored in <function ...>" and the handler's traceback.
  proc = _run_script(IN_A_CALLBACK)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'INTERRUPTED' in proc.stdout.splitlines(), proc.stdout
  assert proc.stderr.count('Exception ignored in') == 1, proc.stderr
  assert 'ValueError: not ours' in proc.stderr and 'KeyboardInterrupt' not in proc.stderr


def _runtime_imports() -> dict:
  """Runtime module -> the runtime modules it imports (also inside functions)."""
  import ast
  root = os.path.join(ROOT, 'tff_algos', 'runtime')
  modules = {}
  for directory, _, files in os.walk(root):
    for f in files:
      if f.endswith('.py'):
        path = os.path.join(directory, f)
        name = os.path.relpath(path[:-3], ROOT).replace(os.sep, '.')
        modules[name[:-len('.__init__')] if name.endswith('.__init__') else name] = path
  imports = {}
  for name, path in modules.items():
    found = set()
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        found.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module:
        submodules = [f'{node.module}.{a.name}' for a in node.names
                      if f'{node.module}.{a.name}' in modules]
        found.update(submodules or [node.module])
    imports[name] = {m for m in found if m in modules and m != name}
  return imports


def test_runtime_modules_import_no_circle():
  imports = _runtime_imports()
  assert 'tff_algos.runtime.backend_options' in imports['tff_algos.runtime.context']
  assert len(imports) >= 10  # the in-process package's modules are seen

  def reachable(start):
    seen, todo = set(), list(imports[start])
    while todo:
      m = todo.pop()
      if m not in seen:
        seen.add(m)
        todo.extend(imports[m])
    return seen

  circles = sorted(m for m in imports if m in reachable(m))
  assert circles == []
