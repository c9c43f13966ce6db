"""TFF's `worker_binary` in a private network namespace, reached through one socket.

TFF 0.87's `worker_binary` has only `--port` and listens on every interface
(`[::]:PORT`): anyone who can reach the port can run TensorFlow graphs on this
machine through TFF's unauthenticated executor protocol. This process keeps
the worker out of reach:

1. it opens the socket the worker is to be reached on, in this host's
   network: a Unix socket (`unix:PATH`, the local workers of a run: a file in
   a directory only this user can enter) or a TCP address (`HOST:PORT`, the
   standalone worker: 127.0.0.1 unless asked otherwise);
2. it moves itself into a new user and network namespace (`unshare`, no
   privileges needed where unprivileged user namespaces are allowed), whose
   only interface is its own loopback, and starts `worker_binary` there:
   its `[::]:PORT` is then reachable from nowhere but this namespace;
3. it relays every connection accepted on the socket of step 1 (which stays
   in the host's network) to the worker, byte for byte.

    python -m tff_algos.runtime.sandbox --listen=unix:/tmp/d/worker.sock

prints `READY <worker pid>` on stdout once the worker answers, or
`UNAVAILABLE <reason>` and exits with status 3 where the namespace cannot be
made. It exits with the worker's status when the worker exits, and stops the
worker on SIGINT/SIGTERM; on Linux both die with their parent
(`PR_SET_PDEATHSIG`). Only the standard library is imported: it starts in
tens of milliseconds.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import importlib.util
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Callable

UNAVAILABLE = 3  # the exit status when no private namespace can be made
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCSIFFLAGS, _IFF_UP = 0x8914, 0x1
_PR_SET_PDEATHSIG = 1
_INNER_PORT = 10000  # any port: the namespace has no other listener
_CHUNK = 1 << 20

try:
  _libc = ctypes.CDLL(None, use_errno=True)
except OSError:
  _libc = None


def worker_binary() -> str:
  """TFF's worker_binary, found without importing TensorFlow."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or spec.origin is None:
    raise FileNotFoundError('tensorflow_federated is not installed')
  return os.path.join(os.path.dirname(spec.origin), 'data', 'worker_binary')


def die_with_parent() -> None:
  """The kernel sends SIGTERM to this process when its parent exits."""
  if _libc is not None and sys.platform.startswith('linux'):
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def listen(address: str) -> socket.socket:
  """A listening socket on `unix:PATH` or `HOST:PORT` (in the current network)."""
  if address.startswith('unix:'):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address[len('unix:'):])
  else:
    host, _, port = address.rpartition(':')
    host = host.strip('[]')
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
  sock.listen(64)
  return sock


def enter_private_network() -> None:
  """Moves this (single-threaded) process into a new user and network
  namespace with its loopback up; OSError where the host forbids it."""
  if _libc is None or not sys.platform.startswith('linux'):
    raise OSError(errno.ENOSYS, 'network namespaces are a Linux feature')
  uid, gid = os.getuid(), os.getgid()
  if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
    code = ctypes.get_errno()
    raise OSError(code, f'unshare: {os.strerror(code)}')
  for path, text in (('/proc/self/setgroups', 'deny'), ('/proc/self/uid_map', f'{uid} {uid} 1'),
                     ('/proc/self/gid_map', f'{gid} {gid} 1')):
    try:  # the same ids inside as outside (cosmetic: file access uses the real ones)
      with open(path, 'w') as f:
        f.write(text)
    except OSError:
      pass
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack('16sH22x', b'lo', _IFF_UP))


class Unavailable(OSError):
  """No private network namespace can be made here (the reason in its text)."""


def start(listen_on: str, max_concurrent_computation_calls: int = -1,
          startup_timeout_s: float = 60.0, preexec_fn=None) -> tuple[subprocess.Popen, int]:
  """Starts this module on `listen_on` (unix:PATH or HOST:PORT) and waits until
  its worker serves; returns (the sandbox's process, the worker_binary's pid).

  Raises `Unavailable` where the namespace cannot be made, RuntimeError where
  the worker exits or does not start within `startup_timeout_s`.
  """
  process = subprocess.Popen(
      [sys.executable, '-m', __name__, f'--listen={listen_on}',
       f'--max_concurrent_computation_calls={max_concurrent_computation_calls}',
       f'--startup_timeout_s={startup_timeout_s}'],
      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
      # Own session: a terminal's Ctrl-C reaches the caller, not the worker
      # mid-round; the caller stops it.
      start_new_session=True, preexec_fn=preexec_fn)
  line = process.stdout.readline()  # the sandbox gives up after startup_timeout_s
  if line.startswith('READY '):
    return process, int(line.split()[1])
  process.wait()
  if line.startswith('UNAVAILABLE '):
    raise Unavailable(line[len('UNAVAILABLE '):].strip())
  raise RuntimeError(f'TFF worker exited with {process.returncode} before it served')


def stop(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
  """Stops a sandbox (and its worker) that `start` started."""
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(timeout_s)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
  if process.stdout is not None:
    process.stdout.close()


def stop_requested_on_signals() -> Callable[[], bool]:
  """Makes SIGINT and SIGTERM ask this process to stop; returns whether one did.

  A flag, not a `threading.Event`: `Event.set()` in a handler deadlocked when
  the signal landed while the main thread held the Event's lock inside
  `wait()`, and the process then ignored every later signal.
  """
  requested = []
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: requested.append(True))
  return lambda: bool(requested)


def _pump(source: socket.socket, sink: socket.socket) -> None:
  buffer = memoryview(bytearray(_CHUNK))
  try:
    while True:
      n = source.recv_into(buffer)
      if not n:
        break
      sink.sendall(buffer[:n])
  except OSError:
    pass
  finally:
    for s in (sink, source):
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass


def _relay(client: socket.socket) -> None:
  try:
    worker = socket.create_connection(('127.0.0.1', _INNER_PORT))
  except OSError:
    client.close()
    return
  for s in (client, worker):
    if s.family != socket.AF_UNIX:
      s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  threading.Thread(target=_pump, args=(worker, client), daemon=True).start()
  _pump(client, worker)
  client.close()
  worker.close()


def _serve(listener: socket.socket) -> None:
  while True:
    try:
      client, _ = listener.accept()
    except OSError:
      return
    threading.Thread(target=_relay, args=(client,), daemon=True).start()


def _wait_until_serving(worker: subprocess.Popen, timeout_s: float) -> bool:
  deadline = time.monotonic() + timeout_s
  while worker.poll() is None and time.monotonic() < deadline:
    try:
      socket.create_connection(('127.0.0.1', _INNER_PORT), timeout=1).close()
      return True
    except OSError:
      time.sleep(0.02)
  return False


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--listen', required=True, help='unix:PATH or HOST:PORT')
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=-1)
  parser.add_argument('--startup_timeout_s', type=float, default=60.0)
  args = parser.parse_args(argv)
  die_with_parent()
  listener = listen(args.listen)  # in the host's network, before leaving it
  try:
    enter_private_network()
  except OSError as e:
    print(f'UNAVAILABLE {e.strerror or e}', flush=True)
    return UNAVAILABLE
  worker = subprocess.Popen(
      [worker_binary(), f'--port={_INNER_PORT}',
       f'--max_concurrent_computation_calls={args.max_concurrent_computation_calls}'],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
  stopped = stop_requested_on_signals()
  try:
    if not _wait_until_serving(worker, args.startup_timeout_s):
      return worker.poll() or 1
    print(f'READY {worker.pid}', flush=True)
    threading.Thread(target=_serve, args=(listener,), daemon=True).start()
    while not stopped():
      time.sleep(0.2)
      if worker.poll() is not None:
        return worker.returncode if worker.returncode >= 0 else 128 - worker.returncode
    return 0
  finally:
    listener.close()
    if worker.poll() is None:
      worker.terminate()  # SIGTERM: SIGINT may be ignored (inherited from a background job)
      try:
        worker.wait(10)
      except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


if __name__ == '__main__':
  sys.exit(main())
