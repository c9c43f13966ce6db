"""The local TFF workers a context starts (`Worker`), and the wait for one
started elsewhere (`wait_ready`).

A `Worker` is TFF's `worker_binary` in a network namespace of its own
(`sandbox`), or with `network='open'` as TFF starts it; either way it dies
with the thread that started it (`PR_SET_PDEATHSIG`) and is stopped by SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

import grpc
import portpicker
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

from tff_algos.errors import UserError
from tff_algos.runtime import sandbox
from tff_algos.runtime.backend_options import check_worker_network

WORKER_BINARY = sandbox.worker_binary()

GRPC_OPTIONS = [
    ('grpc.max_message_length', 2_000_000_000),
    ('grpc.max_receive_message_length', 2_000_000_000),
    ('grpc.max_send_message_length', 2_000_000_000),
]
_PR_SET_PDEATHSIG = 1
try:  # resolved here: no dlopen in the forked child of a threaded process
  _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
  _prctl = None


def _die_with_parent(parent_pid: int):
  def preexec():  # runs in the child between fork and exec
    if _prctl is not None:
      _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
      os._exit(1)
  return preexec


class Worker:
  """One local `worker_binary` process serving TFF's executor protocol.

  `network='private'` (default): the worker runs in a network namespace of its
  own (`sandbox`), reached through a Unix socket in a directory only this
  user can enter, or with `port` on `host`:`port` (loopback unless asked
  otherwise); nothing listens on another interface. `'open'`: TFF's
  worker_binary as it is, listening on every interface at `port`.
  """

  def __init__(self, max_concurrent_computation_calls: int = -1,
               port: Optional[int] = None, startup_timeout_s: float = 60.0,
               network: str = 'private', host: str = '127.0.0.1',
               open_flag: str = '--worker_network=open'):
    if not os.path.isfile(WORKER_BINARY):
      raise RuntimeError(f'TFF worker binary not found at {WORKER_BINARY}')
    check_worker_network(network)
    self._socket_dir = None
    preexec = _die_with_parent(os.getpid()) if sys.platform.startswith('linux') else None
    if network == 'open':
      self.port = port or portpicker.pick_unused_port()
      self.address = f'localhost:{self.port}'
      self.process = subprocess.Popen(
          [WORKER_BINARY, f'--port={self.port}',
           f'--max_concurrent_computation_calls={max_concurrent_computation_calls}'],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
          start_new_session=True, preexec_fn=preexec)  # see sandbox.start
      self.pid = self.process.pid
      self._wait_ready(startup_timeout_s)
      return
    if port is None:
      self.port = None
      self._socket_dir = tempfile.mkdtemp(prefix='tff-worker-')  # mode 0700
      self.address = f'unix:{os.path.join(self._socket_dir, "worker.sock")}'
      listen_on = self.address
    else:
      self.port = port
      self.address = listen_on = f'{host}:{port}'
    try:
      self.process, self.pid = sandbox.start(listen_on, max_concurrent_computation_calls,
                                             startup_timeout_s, preexec)
    except sandbox.Unavailable as e:
      self._remove_socket_dir()
      raise WorkerNetworkUnavailable(
          "TFF's worker_binary listens on every network interface, and this host does not "
          f'allow the private network namespace that keeps it local ({e}); use '
          f'--backend=inprocess (no worker, no socket), or {open_flag} to run it reachable '
          'from other hosts') from None
    except BaseException:
      self._remove_socket_dir()
      raise
    self._wait_ready(startup_timeout_s)

  def _wait_ready(self, timeout_s: float):
    stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(
        grpc.insecure_channel(self.address, GRPC_OPTIONS))
    deadline = time.monotonic() + timeout_s
    while not stub.is_ready:
      if self.process.poll() is not None:
        self._remove_socket_dir()
        raise RuntimeError(f'TFF worker exited with {self.process.returncode}')
      if time.monotonic() > deadline:
        self.stop()
        raise RuntimeError(f'TFF worker on {self.address} did not start')
      time.sleep(0.05)

  def _remove_socket_dir(self):
    if self._socket_dir is not None:
      shutil.rmtree(self._socket_dir, ignore_errors=True)
      self._socket_dir = None

  def stop(self, timeout_s: float = 10.0):
    # SIGTERM, not SIGINT: a process started from a background job inherits
    # SIGINT ignored, and the worker then waited out the whole timeout.
    sandbox.stop(self.process, timeout_s)
    self._remove_socket_dir()


class WorkerNetworkUnavailable(UserError, RuntimeError):
  """The private network namespace of a local worker cannot be made here."""


class WorkerUnreachable(UserError, RuntimeError):
  """No worker answers at an address given by --workers (none started there,
  a wrong host or port): the user starts one or fixes the address."""


def wait_ready(address: str, timeout_s: float = 30.0):
  """Fails clearly (`WorkerUnreachable`, one `error:` line in the binaries)
  when a worker given by address does not answer within `timeout_s`.

  The wait is kept long: such workers are started by hand or by a script
  next to this run, and may still be starting. A note says that it waits
  when the worker does not answer at once, so that the silence is explained.
  """
  channel = grpc.insecure_channel(address, GRPC_OPTIONS)
  ready = grpc.channel_ready_future(channel)
  first = min(1.0, timeout_s)
  try:
    try:
      ready.result(timeout=first)
    except grpc.FutureTimeoutError:
      if timeout_s <= first:
        raise
      print(f'note: waiting up to {timeout_s:g} s for the TFF worker at {address}',
            file=sys.stderr, flush=True)
      ready.result(timeout=timeout_s - first)
  except grpc.FutureTimeoutError:
    raise WorkerUnreachable(
        f'no TFF worker answers at {address} within {timeout_s:g} s (start one with '
        f'`python -m tff_algos.runtime.worker --port=PORT`, or fix --workers)') from None
  finally:
    channel.close()
