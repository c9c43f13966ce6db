"""Local TFF workers are reachable from this host only.

TFF 0.87's worker_binary listens on every interface with an unauthenticated
executor protocol. A run's own workers (`--backend=cpp`, `--workers=N`) run
in a network namespace of their own behind a Unix socket (`sandbox`), so
the host's TCP table (what `ss -ltn` prints, read here from /proc/net) holds
no listener of theirs at all; `--worker_network=open` is TFF's worker as it
is, which the same check sees listening on every interface. The standalone
worker serves 127.0.0.1 unless told otherwise.
"""

import glob
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time

import portpicker
import psutil
import pytest

from binaries import assert_refused
from conftest import wait_dead, worker_pids_of
from paths import ROOT
from tff_algos.runtime import sandbox

SMALL = ['--task=digits', '--model=logistic', '--clients_per_round=4', '--local_steps=2',
         '--client_batch_size=16', '--rounds_per_eval=0', '--noprogress']


def _tcp_listeners() -> dict[int, tuple[str, int]]:
  """Socket inode -> (address, port) of every TCP listener in this network
  namespace (/proc/net/tcp and tcp6, state 0A: the table `ss -ltn` prints)."""
  found = {}
  for name, size in (('tcp', 4), ('tcp6', 16)):
    with open(f'/proc/net/{name}') as f:
      next(f)
      for line in f:
        fields = line.split()
        if fields[3] != '0A':
          continue
        hex_address, hex_port = fields[1].split(':')
        raw = bytes.fromhex(hex_address)
        # /proc prints each 32-bit word in host (little-endian) order.
        raw = b''.join(raw[i:i + 4][::-1] for i in range(0, size, 4))
        found[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(hex_port, 16))
  return found


def listeners_of(pid: int) -> list[tuple[str, int, str]]:
  """(address, port, process name) of the TCP listeners in this host's network
  held by `pid` or its descendants."""
  table = _tcp_listeners()
  out = []
  try:
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
  except psutil.NoSuchProcess:
    return out
  for p in tree:
    for fd in glob.glob(f'/proc/{p.pid}/fd/*'):
      try:
        target = os.readlink(fd)
      except OSError:
        continue
      if target.startswith('socket:['):
        inode = int(target[len('socket:['):-1])
        if inode in table:
          out.append((*table[inode], p.name()))
  return out


def _reachable_from_elsewhere(listeners) -> list:
  return [l for l in listeners if not ipaddress.ip_address(l[0]).is_loopback]


def _train_with_workers(tmp_path, *extra):
  proc = subprocess.Popen(
      [sys.executable, '-m', 'experiments.train', *SMALL, '--workers=2', '--total_rounds=400',
       f'--root_output_dir={tmp_path}', '--experiment_name=run', *extra],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  while len(worker_pids_of(proc.pid)) < 2 or not (tmp_path / 'run' / 'metrics.csv').exists():
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.monotonic() < deadline, 'the run did not start its workers'
    time.sleep(0.2)
  return proc


def _stop(proc):
  proc.send_signal(signal.SIGINT)
  proc.communicate(timeout=120)


@pytest.mark.parametrize('network', ['private', pytest.param('open', marks=pytest.mark.slow)])
def test_a_run_with_two_workers_listens_on_no_interface(tmp_path, network):
  proc = _train_with_workers(tmp_path, f'--worker_network={network}')
  try:
    workers = worker_pids_of(proc.pid)
    listening = listeners_of(proc.pid)
  finally:
    _stop(proc)
  assert wait_dead(workers) == []
  if network == 'private':
    assert listening == []  # not even on loopback: a Unix socket per worker
  else:  # the check sees what TFF's worker does on its own
    open_ports = _reachable_from_elsewhere(listening)
    assert len(open_ports) == 2 and {l[2] for l in open_ports} == {'worker_binary'}


def test_the_standalone_worker_serves_loopback_only_by_default():
  port = portpicker.pick_unused_port()
  proc = subprocess.Popen([sys.executable, '-m', 'tff_algos.runtime.worker', f'--port={port}'],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    line = proc.stdout.readline()
    assert f'serving on port {port} (this machine only' in line, line + proc.stderr.read()
    assert listeners_of(proc.pid) == [('127.0.0.1', port, 'python')]
    with socket.create_connection(('127.0.0.1', port), timeout=10):
      pass
  finally:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0 and 'warning' not in err, err


def test_a_worker_on_every_interface_is_warned_about():
  port = portpicker.pick_unused_port()
  proc = subprocess.Popen([sys.executable, '-m', 'tff_algos.runtime.worker', f'--port={port}',
                           '--host=0.0.0.0'], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert '(every interface' in proc.stdout.readline()
    assert listeners_of(proc.pid) == [('0.0.0.0', port, 'python')]
  finally:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  assert 'warning: the TFF executor protocol is unauthenticated' in err


def test_the_sandbox_says_when_no_namespace_can_be_made(tmp_path):
  code = ('import errno, sys\nfrom tff_algos.runtime import sandbox\n'
          'def forbidden():\n  raise OSError(errno.EPERM, "unshare: Operation not permitted")\n'
          'sandbox.enter_private_network = forbidden\n'
          f'sys.exit(sandbox.main(["--listen=unix:{tmp_path}/w.sock"]))\n')
  res = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
  assert res.returncode == sandbox.UNAVAILABLE
  assert res.stdout == 'UNAVAILABLE unshare: Operation not permitted\n'


def test_a_host_without_namespaces_is_one_line_naming_both_ways_out(tmp_path):
  setup = ('from tff_algos.runtime import sandbox\n'
           'def start(*args):\n  raise sandbox.Unavailable("unshare: Operation not permitted")\n'
           'sandbox.start = start\n')
  code = ('import sys; sys.argv = ["train", "--backend=cpp", "--total_rounds=1", '
          f'"--root_output_dir={tmp_path}"]\n{setup}'
          'from experiments.lib import common\nfrom experiments import train\n'
          'try:\n  common.run(train.main)\nfinally:\n'
          '  print("TF loaded:", "tensorflow" in sys.modules)\n')
  res = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert_refused(res, 'does not allow the private network namespace',
                 '(unshare: Operation not permitted)', '--backend=inprocess',
                 '--worker_network=open', before_tensorflow=False)
