"""Which backend runs the computations, and checks of its options.

Imported by the execution contexts (`context`) and by the in-process backend
(`inprocess`) alike; it imports neither.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

BACKENDS = ('cpp', 'inprocess')
# Where local TFF workers listen: 'private' (a network namespace of their own,
# reached through a Unix socket) or 'open' (every interface, as TFF starts them).
WORKER_NETWORKS = ('private', 'open')
Workers = Union[None, int, str, Sequence[str]]


def parse_workers(workers: Workers) -> Union[None, int, list[str]]:
  """None | N (local workers to start) | ['host:port', ...]; ValueError if bad.

  Everything that the value alone shows is refused here (a count below 1, an
  address without a host or with a port outside 1-65535), so that the
  binaries answer it while parsing their flags instead of after TensorFlow and
  the data have loaded, or after waiting for a worker that cannot exist.
  """
  if workers is None or workers == '' or workers == []:
    return None
  if isinstance(workers, int) or (isinstance(workers, str) and _digits(workers.strip())):
    n = int(workers)
    if n < 1:
      raise ValueError(f'--workers: need at least one worker (a count >= 1, or '
                       f'host:port,... of running workers), got {workers!r}')
    return n
  addresses = workers.split(',') if isinstance(workers, str) else list(workers)
  addresses = [a.strip() for a in addresses]
  for a in addresses:
    host, _, port = a.rpartition(':')
    if not host or not _digits(port):
      raise ValueError(f'--workers: expected a worker count or host:port,... ; got {a!r}')
    if not 1 <= int(port) <= 65535:
      raise ValueError(f'--workers: port {port} of {a!r} is not a port number '
                       '(1-65535); give the port the worker listens on')
  return addresses


def _digits(text: str) -> bool:
  """ASCII digits only ('²'.isdigit() is True, but int() refuses it)."""
  return text.isascii() and text.isdigit()


def check_backend(backend: str, workers: Workers = None,
                  concurrent_clients: Optional[int] = None):
  """Validates a backend/workers combination (before any worker starts)."""
  if backend not in BACKENDS:
    raise ValueError(f'--backend must be one of {BACKENDS}, got {backend!r}')
  # Parsed for every backend: with --workers the backend is 'cpp', where a bad
  # value was found only when the context started (after the data loaded).
  if parse_workers(workers) is not None and backend == 'inprocess':
    raise ValueError('--workers runs TFF worker_binary processes: use it with '
                     '--backend=cpp, not --backend=inprocess')
  if concurrent_clients is not None:
    if backend != 'inprocess':
      raise ValueError('--concurrent_clients is for --backend=inprocess (a worker_binary '
                       'runs its clients concurrently by itself)')
    check_concurrent_clients(concurrent_clients)


def check_concurrent_clients(concurrent_clients) -> None:
  """ValueError unless a positive integer (a bool is not one)."""
  if (isinstance(concurrent_clients, bool) or not isinstance(concurrent_clients, int)
      or concurrent_clients < 1):
    raise ValueError(f'--concurrent_clients must be a positive integer, got '
                     f'{concurrent_clients!r}')


def check_worker_network(network: str) -> None:
  if network not in WORKER_NETWORKS:
    raise ValueError(f'--worker_network must be one of {", ".join(WORKER_NETWORKS)}, '
                     f'got {network!r}')
