"""--backend, --workers, --concurrent_clients, --compile_local_loop: how binaries run TFF.

    --backend=inprocess   (default) compiled computations run in this process's
                          TensorFlow, on its GPUs when it sees any;
    --backend=cpp         TFF's C++ worker_binary (CPU only);
    --concurrent_clients=N
                          inprocess: clients trained at once per device
                          (default: one per CPU core, up to 4; 1 with a GPU);
    --workers=2 | host:port,...
                          a round's clients split over several worker_binary
                          processes (`python -m tff_algos.runtime.worker --port=N`);
                          implies --backend=cpp;
    --compile_local_loop  inprocess: each client's local loop XLA-compiled
                          (`tff_algos.core.local_training.compiled_fold`).

Results agree across backends (tests/test_backends.py), so a run may be resumed
on another backend. See `tff_algos/runtime` and docs/performance.md.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any, Callable, Iterable, Iterator, Optional

from absl import flags

from tff_algos.errors import UserError
from tff_algos.runtime import backend_options

flags.DEFINE_enum('backend', 'inprocess', ['inprocess', 'cpp'],
                  "'inprocess': run the computations in this process's TensorFlow "
                  "(fastest; uses its GPUs); 'cpp': TFF's C++ worker_binary (CPU only).")
flags.DEFINE_string('workers', None, "cpp backend: split each round's clients over "
                    'several TFF workers: a number of local workers to start, or '
                    'host:port,... of running ones (python -m tff_algos.runtime.worker).')


def _check_workers(value) -> bool:
  """absl validator of --workers: its value alone (a count >= 1, or host:port
  with a port number), checked while the flags are parsed, so that every
  binary with these flags answers a bad one with one `error:` line before
  TensorFlow loads (most binaries import it before their own checks)."""
  try:
    backend_options.parse_workers(value)
  except ValueError as e:  # absl says 'flag --workers=...: ' before the message
    raise flags.ValidationError(str(e).removeprefix('--workers: ')) from None
  return True


flags.register_validator('workers', _check_workers)

flags.DEFINE_enum('worker_network', 'private', list(backend_options.WORKER_NETWORKS),
                  "cpp backend: 'private': the local TFF workers (--backend=cpp, --workers=N) "
                  'run in a network namespace of their own, reached through a Unix socket '
                  "only this user can open, so nothing listens on the network; 'open': TFF's "
                  'worker_binary as it is, listening on every interface (its executor '
                  'protocol is unauthenticated: anyone who reaches the port can run '
                  'TensorFlow on this machine). Only for hosts that forbid unprivileged user '
                  'namespaces.')

flags.DEFINE_integer('concurrent_clients', None,
                     'inprocess backend: clients of a round trained at once per device, '
                     'each on its own copy of the client computation (default: one per '
                     'CPU core up to 4; 1 with a GPU). Results do not depend on it.')

flags.DEFINE_bool('compile_local_loop', None,
                  "inprocess backend: XLA-compile each client's local training loop, its "
                  'batches read into memory first: a step of a small model costs ~15 us '
                  'instead of ~250 (results equal up to float rounding; the model must '
                  'compile). Not for convolutional models on a CPU: XLA made the EMNIST '
                  "CNN's steps ~20x slower. Default: on for table6, off elsewhere.")

FLAGS = flags.FLAGS


def workers():
  """--workers (its default when flags are not parsed: library callers, tests)."""
  return FLAGS['workers'].value


def backend() -> str:
  """--backend, where --workers without an explicit --backend means 'cpp'.

  Read through the flag objects, so that library callers (e.g.
  `reproduce.run_experiment` from a test) get the defaults instead of absl's
  UnparsedFlagAccessError.
  """
  if workers() and not FLAGS['backend'].present:
    return 'cpp'
  return FLAGS['backend'].value


def concurrent_clients():
  return FLAGS['concurrent_clients'].value


def worker_network() -> str:
  return FLAGS['worker_network'].value


def compile_local_loop(default: bool = False) -> bool:
  """--compile_local_loop, or when not given the binary's `default` on the
  in-process backend (the only one it runs on: `check` refuses the flag
  elsewhere, and a default does not turn it on there)."""
  value = FLAGS['compile_local_loop'].value
  return default and backend() == 'inprocess' if value is None else value


def check() -> None:
  """ValueError for a bad --backend/--workers/--concurrent_clients/
  --compile_local_loop combination (starts nothing)."""
  from tff_algos import runtime  # pylint: disable=g-import-not-at-top
  runtime.check_backend(backend(), workers(), concurrent_clients())
  if FLAGS['compile_local_loop'].value and backend() != 'inprocess':
    raise ValueError('--compile_local_loop runs on the in-process backend only; drop it '
                     'or use --backend=inprocess (no --workers)')


def values(default_compile: bool = False) -> dict:
  """The runtime flags, for summary.json (`compile_local_loop` resolved with
  the binary's default); with the in-process backend also
  `effective_concurrent_clients`, the lanes it uses (the flag's default
  depends on the machine: its cores, a GPU)."""
  out = dict(backend=backend(), workers=workers(), concurrent_clients=concurrent_clients(),
             compile_local_loop=compile_local_loop(default_compile),
             worker_network=worker_network())
  if backend() == 'inprocess':
    from tff_algos.runtime import inprocess  # pylint: disable=g-import-not-at-top
    out['effective_concurrent_clients'] = inprocess.effective_concurrent_clients(
        concurrent_clients())
  return out


@contextlib.contextmanager
def managed_context(default_compile: bool = False):
  """The chosen backend as TFF's default context, stopped on every way out;
  algorithms built inside it compile their local loops if --compile_local_loop
  (default: `default_compile`)."""
  from tff_algos import runtime  # pylint: disable=g-import-not-at-top
  from tff_algos.core import local_training  # pylint: disable=g-import-not-at-top
  with runtime.managed_context(backend=backend(), workers=workers(),
                               concurrent_clients=concurrent_clients(),
                               worker_network=worker_network()) as context, \
       local_training.compiled_loops(compile_local_loop(default_compile)):
    yield context


def _died_message(workers, total: int) -> str:
  """The one line for a worker process that died under `map_in_processes`."""
  import signal  # pylint: disable=g-import-not-at-top

  def how(code: int) -> str:
    if code > 0:
      return f'exit status {code}'
    try:
      name = signal.Signals(-code).name
    except ValueError:
      name = f'signal {-code}'
    oom = ', often the out-of-memory killer' if -code == signal.SIGKILL else ''
    return f'killed by {name}{oom}'

  codes = {p.exitcode for p in workers} - {None}
  died = sorted(codes - {0, -signal.SIGTERM})  # SIGTERM: how the executor ends the others
  if not died and -signal.SIGTERM in codes and 0 not in codes:
    died = [-signal.SIGTERM]  # killed by someone's SIGTERM
  if not died:  # it returned, e.g. its initialiser failed (its traceback is printed above)
    return (f'a worker process stopped before the {total} items of this run finished '
            '(its error, if any, is printed above); what finished is written: rerun '
            'with --jobs=1 to see the error in this process')
  return (f"a worker process died ({'; '.join(how(c) for c in died)}) before the "
          f'{total} items of this run finished; what finished is written: rerun with '
          'fewer --jobs (each worker holds its own TensorFlow and data), or --jobs=1 to '
          'see its error')


def _init_worker(options: dict) -> None:
  """A process of `map_in_processes`: quiet logs and the backend of `options`
  as its default TFF context, stopped when the process exits."""
  import atexit  # pylint: disable=g-import-not-at-top
  from experiments.lib import common  # pylint: disable=g-import-not-at-top
  # SIGINT, blocked from the start (`map_in_processes`), is ignored from here
  # on (a Ctrl-C that came meanwhile is dropped) and so in the processes this
  # one starts; the pool's SIGTERM ends the process at once, and a C++
  # backend's worker binaries follow it (`PR_SET_PDEATHSIG`,
  # tff_algos/runtime/context.py).
  import signal  # pylint: disable=g-import-not-at-top
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if hasattr(signal, 'pthread_sigmask'):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  from tff_algos import runtime  # pylint: disable=g-import-not-at-top
  # Whole lines: the workers share the parent's stdout, a pipe when captured,
  # where a block-buffered flush could end mid-line, and an unbuffered one
  # (PYTHONUNBUFFERED) writes a print's text and its newline apart: another
  # worker's line (e.g. a grid's `[i/n] ...`) landed inside them. One write a
  # line (a pipe keeps writes of up to 4 KiB whole).
  if isinstance(sys.stdout, io.TextIOWrapper):  # not None (no stdout) or a stand-in
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
  common.quiet_logs()
  runtime.install(backend=options['backend'], workers=options['workers'],
                  concurrent_clients=options['concurrent_clients'],
                  worker_network=options.get('worker_network', 'private'))
  atexit.register(runtime.shutdown)
  if options.get('compile_local_loop'):  # for the whole process: its builds
    from tff_algos.core import local_training  # pylint: disable=g-import-not-at-top
    local_training.set_compiled_loops(True)


def map_in_processes(fn: Callable[[Any], Any], items: Iterable[Any], jobs: int,
                     options: Optional[dict] = None) -> Iterator[Any]:
  """Yields `fn(item)` for every item, as they finish.

  `jobs` <= 1: in this process, in order (its TFF context must be installed).
  Else in up to `jobs` worker processes, spawned (TensorFlow does not survive
  a fork), each with the backend of `options` (default: these flags' `values()`)
  as its context; `fn` must be a module-level function and items and results
  picklable. The flags are not parsed in a worker: pass what `fn` needs.
  """
  items = list(items)
  if jobs <= 1 or len(items) <= 1:
    for item in items:
      yield fn(item)
    return
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import multiprocessing  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  # concurrent.futures, not multiprocessing.Pool: a Pool replaces a worker
  # that dies (killed for memory, a crash in TensorFlow) and waits forever for
  # the task it held; this executor fails every pending task at once
  # (BrokenProcessPool), said below in one line.
  before = set(multiprocessing.active_children())
  executor = concurrent.futures.ProcessPoolExecutor(
      min(jobs, len(items)), mp_context=multiprocessing.get_context('spawn'),
      initializer=_init_worker, initargs=(options or values(),))
  # Ctrl-C reaches the terminal's whole process group: only this process acts
  # on it (leaving this generator ends the workers). The workers must not: one
  # that raised KeyboardInterrupt, e.g. while importing TensorFlow, printed
  # 'Process SpawnProcess-N:' and a traceback under the one stop line. They are
  # spawned by the submits (a spawn context starts them on demand) with SIGINT
  # blocked (a thread's signal mask is inherited, so from their first import
  # on), and `_init_worker` ignores it. Blocked here, not ignored: a Ctrl-C
  # during the submits waits and then stops this process, where an ignored one
  # was lost.
  blockable = hasattr(signal, 'pthread_sigmask')
  finished, workers = False, []
  try:
    try:
      # The caller's mask, unchanged (a call that changes it can raise a pending
      # KeyboardInterrupt after the change, before its result is kept).
      mask = signal.pthread_sigmask(signal.SIG_BLOCK, ()) if blockable else None
      try:
        if mask is not None:
          signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        futures = []
        for item in items:
          futures.append(executor.submit(_call_in_worker, fn, item))
          _record_spawned(workers, before)  # while alive (a dead one leaves the list)
      finally:
        if mask is not None:  # the caller's mask again
          signal.pthread_sigmask(signal.SIG_SETMASK, mask)
      for future in concurrent.futures.as_completed(futures):
        yield future.result()
    except concurrent.futures.process.BrokenProcessPool as e:
      if e.__cause__ is not None:  # no death: something a worker sent could not be read
        raise
      for process in workers:  # their exit codes (the executor ends the others)
        process.join(timeout=10)
      raise UserError(_died_message(workers, len(items))) from None
    finished = True
  finally:
    # Not waiting for the other items: an error, Ctrl-C, or a caller that
    # stopped reading (callers close this generator: `contextlib.closing`;
    # one left open would make the interpreter's exit wait for every item).
    executor.shutdown(wait=finished, cancel_futures=True)
    if not finished:
      # (A Ctrl-C taken by another thread stops a submit before its worker is
      # recorded: those alive now too.)
      _record_spawned(workers, before)
      for process in workers:
        process.terminate()
      for process in workers:
        process.join()


def _record_spawned(workers: list, before: set) -> None:
  """Adds to `workers` the live child processes started since `before`
  (`active_children()` then) that it lacks."""
  import multiprocessing  # pylint: disable=g-import-not-at-top
  workers.extend(p for p in multiprocessing.active_children()
                 if p not in before and p not in workers)


def _call_in_worker(fn: Callable[[Any], Any], item: Any) -> Any:
  """`fn(item)` in a worker process, its exception one the parent can read
  (one that cannot be read back breaks the whole pool): as it is where it
  survives pickling, else a `UserError` as a plain one and any other as a
  RuntimeError with its traceback."""
  import pickle  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  try:
    return fn(item)
  except Exception as e:  # pylint: disable=broad-except
    try:
      pickle.loads(pickle.dumps(e))
    except Exception:  # pylint: disable=broad-except
      if isinstance(e, UserError):
        raise UserError(str(e)) from None
      raise RuntimeError(''.join(traceback.format_exception(e))) from None
    raise
