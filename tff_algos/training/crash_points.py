"""Named points where a fault-injection test makes the process kill itself.

`TFF_ALGOS_CRASH_AT=<name>:<n>` sends SIGKILL to this process the n-th time it
reaches the point `<name>` (n defaults to 1), as a power cut or `kill -9` would
at that instant: nothing after it runs, no handler, no `finally`.
`TFF_ALGOS_CRASH_AT=<name>:<n>:stop` sends SIGSTOP instead: the process holds
there until a test has sent it a signal (SIGTERM, SIGINT) and SIGCONT, so the
signal lands at that point, whatever the speed of the machine. Unset (every
real run), `reached` is one comparison.

Points: `store_scatter_logged` (undo entries synced, no row written yet),
`store_scatter_rows` (the first of a scatter's rows written, the others not),
`store_checkpoint` (the checksums saved, the bitmap not), `checkpoint_state`
(the client store checkpointed, the server state not), `checkpoint_manifest`
(the server state saved, its manifest entry not), `metrics_row` (a round's
metrics.csv row written, its TensorBoard event not).
"""

from __future__ import annotations

import os
import signal

ENV = 'TFF_ALGOS_CRASH_AT'


def _target():
  spec = os.environ.get(ENV)
  if not spec:
    return None
  name, _, rest = spec.partition(':')
  count, _, action = rest.partition(':')
  if action not in ('', 'stop'):
    raise ValueError(f'{ENV}={spec}: the action after the count must be "stop" or nothing')
  return name, int(count or 1), signal.SIGSTOP if action else signal.SIGKILL


_TARGET = _target()
_seen = {}


def reached(name: str) -> None:
  """Kills (or stops) the process if this is the configured point's n-th arrival."""
  if _TARGET is None or _TARGET[0] != name:
    return
  _seen[name] = _seen.get(name, 0) + 1
  if _seen[name] == _TARGET[1]:
    os.kill(os.getpid(), _TARGET[2])
