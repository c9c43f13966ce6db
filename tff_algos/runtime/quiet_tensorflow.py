"""A quiet TensorFlow import, for programs that import it late.

`install()`, called before TensorFlow is imported (the experiment binaries'
package and the standalone worker call it on import):

* quiets TensorFlow's C++ start-up chatter (TF_CPP_MIN_LOG_LEVEL=2) unless the
  user asked for it (TF_CPP_MIN_LOG_LEVEL=0);
* makes TensorFlow start in TF2 (eager) mode whenever it is imported
  (TF2_BEHAVIOR=1): the binaries import it in their main, after their flags
  are checked, so that a bad flag is answered at once, and TensorFlow imported
  after absl's app.run has started would otherwise build Keras models in graph
  mode (TF 2.14: "IndexError: list index out of range" in Sequential.add);
* drops three harmless error lines from TensorFlow's import (below).
"""

import os
import re
import sys

# TensorFlow 2.14 prints three ERROR lines on every import, whatever the
# machine: "Unable to register cuDNN/cuFFT/cuBLAS factory: Attempting to
# register factory for plugin ... when one has already been registered"
# (tensorflow/tensorflow#62075: its CUDA plugins are registered twice). They
# are harmless and say nothing about this machine's GPU, yet they were the
# first thing every binary printed, in each --jobs worker too.
# TF_CPP_MIN_LOG_LEVEL=3 would also hide real errors; instead, while TensorFlow
# imports, stderr (fd 2) goes through a forked filter process that drops them
# and passes every other line on, in order. It reads until the last writer
# closes, so a crash of this process during the import still gets its last
# words out. TF_CPP_MIN_LOG_LEVEL=0 keeps them.
_HARMLESS = re.compile(rb'Unable to register cu(DNN|FFT|BLAS) factory: Attempting to '
                       rb'register factory for plugin cu\w+ when one has already been registered')


class _TensorFlowImportFilter:
  """A meta path finder whose spec of `tensorflow` runs the module's import
  under `_filtered_stderr`; it leaves `sys.meta_path` when that import runs."""

  def __init__(self):
    self._finding = False

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name != 'tensorflow' or self._finding:
      return None
    import importlib.util  # pylint: disable=g-import-not-at-top
    self._finding = True  # the search below meets this finder again
    try:
      spec = importlib.util.find_spec(name)
    finally:
      self._finding = False
    loader = getattr(spec, 'loader', None)
    if loader is None or not hasattr(loader, 'exec_module'):
      return spec
    execute = loader.exec_module

    def exec_module(module):
      del loader.exec_module  # the loader's own again
      if self in sys.meta_path:
        sys.meta_path.remove(self)
      return _filtered_stderr(execute, module)

    loader.exec_module = exec_module
    return spec


def _filtered_stderr(fn, *args):
  """fn(*args) with fd 2 written through a forked process that drops
  `_HARMLESS` lines; fn(*args) as it is where fd 2 cannot be redirected or
  threads run (a fork copies only this one)."""
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  if threading.active_count() > 1:
    return fn(*args)
  try:
    if sys.stderr is not None:
      sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):
    return fn(*args)
  try:
    read_end, write_end = os.pipe()
  except OSError:
    os.close(saved)
    return fn(*args)
  try:
    pid = os.fork()
  except Exception:  # pylint: disable=broad-except
    for fd in (saved, read_end, write_end):
      os.close(fd)
    return fn(*args)
  if pid == 0:  # the filter: reads until every writer has closed the pipe
    try:
      for sig in (signal.SIGINT, signal.SIGTERM):  # the parent says what they did
        signal.signal(sig, signal.SIG_IGN)
      os.close(write_end)
      os.close(saved)
      _copy_lines(read_end, 2)
    finally:
      os._exit(0)  # pylint: disable=protected-access
  os.close(read_end)
  os.dup2(write_end, 2)
  os.close(write_end)
  try:
    return fn(*args)
  finally:
    if sys.stderr is not None:
      try:
        sys.stderr.flush()
      except (OSError, ValueError):
        pass
    os.dup2(saved, 2)  # the pipe's last writer closed: the filter drains it and ends
    os.close(saved)
    _await_filter(pid)


def _await_filter(pid: int, patience_s: float = 5.0) -> None:
  """Waits until the filter has written its lines (so that they come before
  anything printed next) and ends, for at most `patience_s`: a process that
  the import started and that holds a copy of the pipe keeps it reading, and
  then it goes on by itself."""
  import time  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + patience_s
  try:
    while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
      time.sleep(0.001)
  except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored, a child watcher)
    pass


def _copy_lines(source: int, sink: int) -> None:
  """The lines read from `source` but `_HARMLESS` ones, written to `sink`;
  reads to the end even when `sink` fails (a writer must never block)."""
  pending, writable = b'', True
  while True:
    chunk = os.read(source, 1 << 16)
    if chunk:
      *lines, pending = (pending + chunk).split(b'\n')
      out = b''.join(line + b'\n' for line in lines if not _HARMLESS.search(line))
    else:  # the end: an unterminated last line
      out = b'' if _HARMLESS.search(pending) else pending
    while writable and out:
      try:
        out = out[os.write(sink, out):]
      except OSError:
        writable = False
    if not chunk:
      return


def install() -> None:
  """Sets the environment above and, unless TensorFlow is imported already or
  TF_CPP_MIN_LOG_LEVEL=0 asks for every line, the filter of its import."""
  verbose = os.environ.get('TF_CPP_MIN_LOG_LEVEL') == '0'
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF2_BEHAVIOR', '1')
  if (not verbose and 'tensorflow' not in sys.modules and
      not any(isinstance(f, _TensorFlowImportFilter) for f in sys.meta_path)):
    sys.meta_path.insert(0, _TensorFlowImportFilter())
