"""Test-suite wide TFF runtime: one managed worker, checked dead at the end."""

import os
import signal
import time

import psutil
import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_algos import runtime  # noqa: E402


# SIGINT as a terminal sends it, for the children the tests interrupt. A shell
# starts background jobs with SIGINT ignored and children inherit that; Python
# then never raises KeyboardInterrupt (seen: the suite run with `&` from a
# script failed the SIGINT tests). A handled signal is reset to its default
# across exec, so setting it here is enough, with no `preexec_fn`: that makes
# `subprocess` fork (not vfork) and run Python in a child of a process whose
# gRPC threads may be busy -- gRPC then skips its fork handlers and the child
# printed "Kick failed: eventfd_write: Bad file descriptor" (CI, 2026-11-28).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)


def worker_pids_of(pid: int) -> list[int]:
  """worker_binary processes that are children of `pid` (alive ones)."""
  try:
    children = psutil.Process(pid).children(recursive=True)
  except psutil.NoSuchProcess:
    return []
  return [c.pid for c in children if 'worker_binary' in ' '.join(_cmdline(c))]


def _cmdline(p):
  try:
    return p.cmdline()
  except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
    return []


def open_files_under(directory) -> list[str]:
  """Files under `directory` that this process holds open (Linux /proc)."""
  held = []
  for fd in os.listdir('/proc/self/fd'):
    try:
      target = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:  # the listing's own descriptor, closed since
      continue
    if target.startswith(str(directory) + os.sep):
      held.append(target)
  return held


def wait_dead(pids, timeout_s=10.0) -> list[int]:
  """Returns the pids still alive (not zombies) after waiting up to `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  alive = list(pids)
  while alive and time.monotonic() < deadline:
    alive = [p for p in alive if _running(p)]
    if alive:
      time.sleep(0.1)
  return alive


def _running(pid: int) -> bool:
  """Whether `pid` is a live process (not a zombie). A process that exits
  between two questions about it is not running: `status()` of a pid that
  `pid_exists` had just seen raised NoSuchProcess (a flaky test)."""
  try:
    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  ctx = runtime.install()
  pids = list(ctx.pids)
  yield ctx
  runtime.shutdown()
  assert wait_dead(pids) == [], 'the test session leaked TFF worker processes'


@pytest.fixture
def offline(monkeypatch):
  """TFF downloads off, and any network connection fails the test."""
  import socket  # pylint: disable=g-import-not-at-top
  from tasks import tff_data  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(tff_data.ALLOW_DOWNLOAD_ENV, raising=False)

  def no_network(*args, **kwargs):
    raise AssertionError(f'network access attempted: {args}')

  monkeypatch.setattr(socket, 'create_connection', no_network)


@pytest.fixture(scope='module')
def task():
  """The digits task with its logistic model: 20 clients, batches of 16 (a test
  module may define its own `task`)."""
  from tasks import TaskOptions, get_task  # pylint: disable=g-import-not-at-top
  return get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='logistic'))


@pytest.fixture(scope='module')
def client_data(task, request):
  """Fixed (unshuffled) datasets of the first `NUM_CLIENTS` clients (the test
  module's constant) of `task`: identical input for every process compared."""
  return [task.client_dataset(cid) for cid in task.client_ids[:request.module.NUM_CLIENTS]]
