"""Serves one TFF worker for `--workers=host:port,...` (multi-worker runs).

    python -m tff_algos.runtime.worker --port=8000

starts TFF's `worker_binary` on the port and stays in the foreground; Ctrl-C or
SIGTERM stops it (and it dies with this process, even on SIGKILL). The
worker serves plain TFF gRPC: any number of machines can run one, and a
trainer started with `--workers=hostA:8000,hostB:8000` splits every round's
clients over them. Exits with status 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=-1)
  args = parser.parse_args(argv)
  # A bare TensorFlow import printed nine lines of start-up chatter above the
  # one that says the worker serves.
  from tff_algos.runtime import quiet_tensorflow  # pylint: disable=g-import-not-at-top
  quiet_tensorflow.install()
  from tff_algos.runtime.context import Worker  # pylint: disable=g-import-not-at-top
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  worker = Worker(args.max_concurrent_computation_calls, port=args.port)
  try:
    print(f'TFF worker serving on port {worker.port} (pid {worker.pid}); '
          'Ctrl-C to stop', flush=True)
    while not stop.wait(0.5):
      if worker.process.poll() is not None:
        print(f'worker exited with {worker.process.returncode}', file=sys.stderr)
        return 1
  finally:
    worker.stop()
  return 0


if __name__ == '__main__':
  sys.exit(main())
