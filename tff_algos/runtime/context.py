"""TFF execution contexts whose worker processes cannot outlive us.

TFF 0.87's default context starts `tensorflow_federated/data/worker_binary` lazily
and tries to stop it in `__del__` at interpreter exit, which fails (the
`subprocess` module is already torn down), orphaning the worker. Here the worker
is started eagerly by us, and stopped on every way out:

* `close()` / the context manager / `atexit` on normal exit and exceptions;
* SIGINT and SIGTERM handlers that stop the workers, then call the handler
  that was there before (the experiment binaries raise `KeyboardInterrupt` for
  both) or do the default (KeyboardInterrupt / exit status 143);
* on Linux, `PR_SET_PDEATHSIG` so the kernel sends SIGTERM to the worker when
  the thread that started it dies, even on SIGKILL of our process.

After a shutdown (or if a worker we started exits) a call on the context raises
`WorkerStopped` (a `UserError`: the run resumes when restarted) instead of TFF's
endless retry, and after a signal
`raise_if_interrupted()` (asked by `run_training` between rounds) raises
KeyboardInterrupt even if Python swallowed the handler's own exception.

The executor stack is TFF's own (`RemoteExecutor` over a gRPC stub, in a
`ResourceManagingExecutorFactory`, compiled by the native compiler), i.e. the
same as `tff.backends.native.create_sync_local_cpp_execution_context`.

Backends (`install(backend=..., workers=...)`, flags --backend / --workers):

* 'cpp' (`install`'s default; the binaries default to 'inprocess'): one local
  worker_binary runs every computation;
* 'cpp' with `workers`: a round's clients are split over several worker_binary
  processes by TFF's `MergeableCompExecutionContext` (one async remote context
  per worker, the MergeableCompForm compiler); `workers` is a number of local
  workers that we start and own, or 'host:port' addresses of workers started
  elsewhere (`python -m tff_algos.runtime.worker --port=N`), which we use but
  do not stop (TFF's context returns client-placed results in the order the
  workers finish; we keep them in client order);
* 'inprocess': no worker; computations run in this process's TensorFlow, on its
  GPUs when it sees any, `concurrent_clients` clients at a time per device
  (`tff_algos/runtime/inprocess/`).

The local workers we start run in a network namespace of their own, reached
through a Unix socket (`Worker`, `sandbox`): worker_binary listens on every
interface, and its executor protocol has no authentication.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
from typing import Callable, Optional

import grpc
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.context_stack import runtime_error_context
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

from tff_algos.errors import UserError
from tff_algos.runtime.backend_options import (Workers, check_backend, check_worker_network,
                                                parse_workers)
# The context's workers and their errors (also said here: `context.Worker`).
from tff_algos.runtime.workers import (GRPC_OPTIONS as _GRPC_OPTIONS, WORKER_BINARY, Worker,
                                       WorkerNetworkUnavailable, WorkerUnreachable, wait_ready)


class WorkerStopped(UserError, RuntimeError):
  """A call reached a worker that has exited or that this process has stopped
  (not retryable); the run resumes from its last checkpoint when restarted."""


def _stack_factory(address: str, stopped: Callable[[], Optional[str]]):
  """TFF's executor stack: a `RemoteExecutor` on the worker at `address`.

  TFF retries a call whose worker is unreachable, for ever (backoff up to
  30 s). Once `stopped()` gives a reason (we stopped our workers, or one of
  them exited) no retry can succeed, so a new executor -- which TFF's retry
  asks for -- raises `WorkerStopped` instead.
  """
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(
      grpc.insecure_channel(address, _GRPC_OPTIONS))

  def stack_fn(cardinalities):
    reason = stopped()
    if reason is not None:
      raise WorkerStopped(f'{reason}; rerun the same command to resume from the last '
                          'checkpoint (in Python: tff_algos.runtime.install() starts '
                          'a new context)')
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = 0
    ex = remote_executor.RemoteExecutor(stub)
    ex.set_cardinalities(cardinalities)
    return ex

  return python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=stack_fn)


async def after_merge_in_client_order(comp, merge_result, arg_list, execution_contexts):
  """`after_merge` on every subround, results in subround (= client) order.

  Replaces TFF 0.87's `_invoke_after_merge_in_async_pool`, which concatenates
  the subrounds' results in the order the workers FINISH; the CLIENTS-placed
  results of a round (e.g. the new client states of FedDyn and SCAFFOLD) were
  then handed to the wrong clients whenever the second worker finished first
  (measured: up to 0.23 off one worker's model after 2 rounds). As in TFF, at
  most one subround runs per context at a time.
  """
  n = len(execution_contexts)
  results = []
  for start in range(0, len(arg_list), n):
    results.extend(await asyncio.gather(*[
        mergeable_comp_execution_context._compute_after_merged(  # pylint: disable=protected-access
            comp, arg, merge_result, context)
        for arg, context in zip(arg_list[start:start + n], execution_contexts)]))
  return results


# TFF's own `after_merge` step, which `_fix_mergeable_client_order` replaces.
tff_after_merge_in_finishing_order = mergeable_comp_execution_context._invoke_after_merge_in_async_pool  # pylint: disable=protected-access


def _fix_mergeable_client_order():
  module = mergeable_comp_execution_context
  if module._invoke_after_merge_in_async_pool is not after_merge_in_client_order:  # pylint: disable=protected-access
    module._invoke_after_merge_in_async_pool = after_merge_in_client_order  # pylint: disable=protected-access


def _native_context(address: str, stopped: Callable[[], Optional[str]], sync: bool = True):
  cls = (sync_execution_context.SyncExecutionContext if sync
         else async_execution_context.AsyncExecutionContext)
  return cls(executor_fn=_stack_factory(address, stopped),
             compiler_fn=native_compiler.desugar_and_transform_to_native,
             transform_args=tensorflow_computation.transform_args,
             transform_result=tensorflow_computation.transform_result)


class ManagedContext:
  """A sync TFF execution context backed by workers this object owns."""

  def __init__(self, max_concurrent_computation_calls: int = -1,
               backend: str = 'cpp', workers: Workers = None,
               concurrent_clients: Optional[int] = None, worker_network: str = 'private'):
    check_backend(backend, workers, concurrent_clients)
    check_worker_network(worker_network)
    workers = parse_workers(workers)
    self.backend, self.requested_workers = backend, workers
    self.worker_network = worker_network
    self.concurrent_clients = concurrent_clients
    self.workers: list[Worker] = []
    self.addresses: list[str] = []
    self._closed = False
    if backend == 'inprocess':
      from tff_algos.runtime import inprocess  # pylint: disable=g-import-not-at-top
      self.context = inprocess.create_context(concurrent_clients=concurrent_clients)
      return
    try:
      if workers is None or isinstance(workers, int):
        for _ in range(workers or 1):
          self.workers.append(Worker(max_concurrent_computation_calls,
                                     network=worker_network))
        self.addresses = [w.address for w in self.workers]
      else:
        self.addresses = list(workers)
        for a in self.addresses:
          wait_ready(a)
    except BaseException:
      self.close()
      raise
    if workers is None:
      self.context = _native_context(self.addresses[0], self._stop_reason)
    else:
      # TFF's multi-worker execution: each call's clients are split into one
      # subround per worker; partial aggregates are merged, then `after_merge`
      # (whose CLIENTS results we keep in client order: see above).
      _fix_mergeable_client_order()
      self.context = mergeable_comp_execution_context.MergeableCompExecutionContext(
          async_contexts=[_native_context(a, self._stop_reason, sync=False)
                          for a in self.addresses],
          compiler_fn=mergeable_comp_compiler.compile_to_mergeable_comp_form,
          transform_result=tensorflow_computation.transform_result)

  @property
  def pids(self) -> list[int]:
    return [w.pid for w in self.workers]

  def _stop_reason(self) -> Optional[str]:
    """Why calls can no longer reach the workers (None: they can)."""
    if self._closed:
      return 'the TFF context was shut down'
    for w in self.workers:
      if w.process.poll() is not None:
        return (f'the TFF worker_binary (pid {w.pid}, {w.address}) exited with '
                f'status {w.process.returncode}')
    return None

  def close(self):
    if self._closed:
      return
    self._closed = True
    for w in self.workers:
      w.stop()


_lock = threading.RLock()  # re-entrant: a signal may arrive inside install()
_active: Optional[ManagedContext] = None
_previous_handlers: dict[int, object] = {}
# The signal (SIGINT, or SIGTERM with a Python handler of its own) that shut the
# context down. Python may swallow the exception raised by the handler (e.g.
# when it lands in a weakref callback), so a run also asks
# `raise_if_interrupted()` between rounds, and `_quiet_swallowed_interrupt`
# keeps Python from printing the swallowed one. Cleared by the next `install()`.
_interrupted: Optional[int] = None


def _shutdown():
  global _active
  with _lock:
    ctx, _active = _active, None
  if ctx is not None:
    ctx.close()


def on_signal(signum, frame):
  """The SIGINT/SIGTERM handler `install()` sets: stops the workers, then
  calls the previous handler (or does the default)."""
  global _interrupted
  _interrupted = signum
  _shutdown()
  previous = _previous_handlers.get(signum)
  if callable(previous):
    previous(signum, frame)
  elif signum == signal.SIGINT:
    raise KeyboardInterrupt
  else:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _quiet_swallowed_interrupt(unraisable):
  """`sys.unraisablehook` while handlers are installed: drops the
  KeyboardInterrupt of `on_signal` that Python could not raise (it landed in a
  weakref callback or a `__del__`), which it would print as "Exception ignored
  in ..." with a traceback; `raise_if_interrupted()` raises it between rounds.
  Anything else goes to the hook that was there before."""
  if _interrupted is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
    return
  _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def _install_handlers():
  global _previous_unraisablehook
  if threading.current_thread() is not threading.main_thread():
    return
  if sys.unraisablehook is not _quiet_swallowed_interrupt:
    _previous_unraisablehook, sys.unraisablehook = (sys.unraisablehook,
                                                   _quiet_swallowed_interrupt)
  for sig in (signal.SIGINT, signal.SIGTERM):
    current = signal.getsignal(sig)
    if current is signal.SIG_IGN:  # e.g. SIGINT of a background job: keep ignoring
      continue
    if current is not on_signal:
      _previous_handlers[sig] = current if current not in (
          signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler) else None
      signal.signal(sig, on_signal)


def release_tff_default_context():
  """Replaces TFF's import-time default context (unless ours is installed) and
  collects it now.

  That context holds a `ServiceManager` whose `__del__`, when it runs during
  interpreter teardown, prints "Exception ignored in ... 'NoneType' object has
  no attribute 'Popen'"; collected while `subprocess` still exists it is quiet.
  """
  with _lock:
    if _active is not None:
      return
    context_stack_impl.context_stack.set_default_context(
        runtime_error_context.RuntimeErrorContext())
  gc.collect()


def _at_exit():
  _shutdown()
  release_tff_default_context()


atexit.register(_at_exit)


def install(max_concurrent_computation_calls: int = -1, backend: str = 'cpp',
            workers: Workers = None, concurrent_clients: Optional[int] = None,
            worker_network: str = 'private') -> ManagedContext:
  """Makes a managed context TFF's default; idempotent (the running one is kept).

  `worker_network`: 'private' (local workers unreachable from other hosts, see
  `Worker`) or 'open' (TFF's worker_binary listening on every interface).
  """
  global _active, _interrupted
  with _lock:
    if _active is None:
      _interrupted = None
      _active = ManagedContext(max_concurrent_computation_calls, backend, workers,
                               concurrent_clients, worker_network)
      context_stack_impl.context_stack.set_default_context(_active.context)
    elif (_active.backend, _active.requested_workers, _active.concurrent_clients,
          _active.worker_network) != (backend, parse_workers(workers), concurrent_clients,
                                      worker_network):
      raise RuntimeError(f'a {_active.backend!r} context is installed already; '
                         'shutdown() it before installing another backend')
    ctx = _active
  _install_handlers()
  return ctx


def raise_if_interrupted():
  """Raises KeyboardInterrupt if a signal shut the context down (even if the
  handler's own exception was swallowed), until the next `install()`."""
  if _interrupted is not None:
    raise KeyboardInterrupt(f'signal {_interrupted} shut the TFF context down; call '
                            'tff_algos.runtime.install() for a new one')


def active() -> Optional[ManagedContext]:
  """The installed managed context, if any."""
  return _active


def shutdown():
  """Stops the managed workers (a later `install()` starts fresh ones)."""
  _shutdown()


@contextlib.contextmanager
def managed_context(max_concurrent_computation_calls: int = -1, backend: str = 'cpp',
                    workers: Workers = None, concurrent_clients: Optional[int] = None,
                    worker_network: str = 'private'):
  ctx = install(max_concurrent_computation_calls, backend, workers, concurrent_clients,
                worker_network)
  try:
    yield ctx
  finally:
    shutdown()
