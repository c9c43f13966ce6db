"""Serves one TFF worker for `--workers=host:port,...` (multi-worker runs).

    python -m tff_algos.runtime.worker --port=8000

starts TFF's `worker_binary` in a network namespace of its own and serves it
on 127.0.0.1:8000 only (`sandbox`): TFF's executor protocol has no
authentication, so anyone who reaches the port can run TensorFlow on this
machine. To use it from another machine, forward the port over SSH there:

    ssh -N -L 8000:127.0.0.1:8000 worker-host     # on the trainer's machine
    python -m experiments.train --workers=localhost:8000 ...

(one `-L` per worker; SSH authenticates and encrypts). `--host=0.0.0.0`
serves it on every interface, for a network where only trusted machines can
reach this one; `--network=open` runs TFF's worker_binary as it is (every
interface), for hosts that forbid unprivileged user namespaces.

It stays in the foreground; Ctrl-C or SIGTERM stops it (and it dies with this
process, even on SIGKILL). Exits with status 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time

from tff_algos.runtime import sandbox


def _is_loopback(host: str) -> bool:
  if host == 'localhost':
    return True
  try:
    return ipaddress.ip_address(host.strip('[]')).is_loopback
  except ValueError:
    return False


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--host', default='127.0.0.1',
                      help='address to serve on (default 127.0.0.1: this machine only)')
  parser.add_argument('--network', choices=('private', 'open'), default='private',
                      help="'open': TFF's worker_binary on every interface, unsandboxed")
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=-1)
  return parser


def main(argv=None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.network == 'open' and args.host != '127.0.0.1':
    parser.error('--host is for --network=private (an open worker serves every interface)')
  # A bare TensorFlow import printed nine lines of start-up chatter above the
  # one that says the worker serves.
  from tff_algos.runtime import quiet_tensorflow  # pylint: disable=g-import-not-at-top
  quiet_tensorflow.install()
  from tff_algos.errors import UserError  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime.context import Worker  # pylint: disable=g-import-not-at-top
  stopped = sandbox.stop_requested_on_signals()
  try:
    worker = Worker(args.max_concurrent_computation_calls, port=args.port,
                    network=args.network, host=args.host, open_flag='--network=open')
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  where = ('every interface' if args.network == 'open' or not _is_loopback(args.host)
           else 'this machine only')
  try:
    print(f'TFF worker serving on port {args.port} ({where}; pid {worker.pid}); '
          'Ctrl-C to stop', flush=True)
    if where == 'every interface':
      print('warning: the TFF executor protocol is unauthenticated: anyone who reaches '
            f'port {args.port} can run TensorFlow here; prefer the default --host and an '
            'SSH tunnel', file=sys.stderr, flush=True)
    while not stopped():
      time.sleep(0.5)
      if worker.process.poll() is not None:
        print(f'worker exited with {worker.process.returncode}', file=sys.stderr)
        return 1
  finally:
    worker.stop()
  return 0


if __name__ == '__main__':
  sys.exit(main())
