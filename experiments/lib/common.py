"""Start-up and error reporting shared by the experiment binaries.

Every binary ends with `common.run(main)` instead of `app.run(main)`:

* a `tff_algos.errors.UserError` (bad flag, missing dataset, unusable run
  directory, a worker that died, ...), a flag that absl cannot parse, a
  positional argument and an empty output directory flag print one
  ``error: <message>`` line and exit with status 2, without a traceback;
* ``--help`` (and absl's other help flags) exit with status 0;
* Ctrl-C (SIGINT) and SIGTERM print one line saying where the run stopped and
  that the same command resumes it (exit status 130 / 143);
* a closed output pipe (``| head``) ends the binary as SIGPIPE would (status
  141) with one line on stderr, not a ``BrokenPipeError`` traceback;
* a finished run that loaded TensorFlow ends without the interpreter's
  teardown (`_exit_without_teardown`);
* TFF's import-time default context is released before the interpreter tears
  its modules down, so its ``ServiceManager.__del__`` prints nothing at exit.
"""

import os
import signal
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

from tff_algos.errors import UserError
from tff_algos.training import run_dir

USAGE_ERROR = 2  # exit status for bad flags or inputs


def fail(message) -> int:
  """Prints one 'error: ...' line to stderr; returns the usage-error status."""
  print(f'error: {message}', file=sys.stderr)
  return USAGE_ERROR


def writable_dir(path: str, flag: str) -> str:
  """Creates `path` and checks that a file can be written in it, so that a bad
  output directory is refused before any work (not by a traceback at the end)."""
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix='.write_check'):
      pass
  except OSError as e:
    raise run_dir.unusable_dir(path, e, flag) from None
  return path


def dirs_to_create(path: str) -> list[str]:
  """The directories that making `path` would create, deepest first (for
  `remove_empty` when what follows is refused)."""
  new = []
  path = os.path.abspath(path)
  while not os.path.exists(path):
    new.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return new


def remove_empty(directories: list[str]) -> None:
  """Removes each of `directories` (`dirs_to_create`'s, deepest first) that
  is empty; stops at the first that is not (it and those above it stay)."""
  for directory in directories:
    try:
      os.rmdir(directory)
    except OSError:
      return


def quiet_logs():
  """Keeps absl/TF INFO chatter (checkpoint writes, font caches) off the console."""
  import tensorflow as tf
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  import logging as py_logging
  py_logging.getLogger('matplotlib').setLevel(py_logging.WARNING)


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt so the
  run unwinds (workers stopped, files closed) and says where it stopped."""


_terminated = False  # SIGTERM arrived (its exception may have been swallowed)


def _raise_terminated(signum, frame):
  del signum, frame
  global _terminated
  _terminated = True
  raise Terminated()


def stop_message(interrupt: KeyboardInterrupt) -> str:
  """The one line printed for Ctrl-C / SIGTERM: a stopped run's own (after
  which round, also when a second signal interrupted its unwinding), else a
  generic one."""
  training = sys.modules.get('tff_algos.training.loop')  # never imported just for this
  while training is not None and interrupt is not None:  # Python keeps it acyclic
    if isinstance(interrupt, training.Stopped):
      return str(interrupt)
    interrupt = interrupt.__context__
  return 'stopped; rerun the same command to resume'


# absl's help flags: each prints its text and exits with status 1.
_HELP_FLAGS = frozenset({'help', '?', 'helpshort', 'helpfull', 'helpxml'})

# The flags that name where a binary writes (`--root_output_dir` of the trainer
# and local_update_decay, `--output_dir` of quadratic_toy, nastya, table6).
OUTPUT_DIR_FLAGS = ('root_output_dir', 'output_dir')
# Flags naming a file or directory: a leading ~ is the home directory. The shell
# leaves it as it is after '=' (--root_output_dir=~/runs), and the run was
# written into a directory named '~' under the current one.
PATH_FLAGS = OUTPUT_DIR_FLAGS + ('cache_dir', 'libsvm_path', 'sent140_dir', 'store_dir')


def _asks_for_help(argv) -> bool:
  """Whether the command line holds one of absl's help flags (before '--')."""
  for arg in argv[1:]:
    if arg == '--':
      return False
    name = arg.lstrip('-').split('=', 1)[0] if arg.startswith('-') else None
    if name in _HELP_FLAGS:
      return True
  return False


def _parse_flags(argv):
  """absl's parsing, a bad value answered with one 'error:' line and status 2.

  Also refused here, before the binary's main (and so before TensorFlow):
  positional arguments, which no binary takes (absl printed its whole --help
  above the complaint, status 1), and an empty output directory flag (the run
  was written into the current directory). `--help` exits with status 0, as a
  user expects of a request for help (absl's help flags exit with 1).
  """
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(fail(f'{e}; see --help'))
  except SystemExit as e:
    if e.code == 1 and _asks_for_help(argv):  # the help was printed: a success
      sys.exit(0)
    raise
  if len(rest) > 1:
    extra = ' '.join(repr(a) for a in rest[1:])
    sys.exit(fail(f'unexpected argument{"s" if len(rest) > 2 else ""} {extra}: this '
                  'binary takes no positional arguments; flags are written --name=value '
                  '(see --help)'))
  for name in PATH_FLAGS:
    value = flags.FLAGS[name].value if name in flags.FLAGS else None
    if isinstance(value, str) and value.startswith('~'):
      flags.FLAGS[name].value = os.path.expanduser(value)
  for name in OUTPUT_DIR_FLAGS:
    if name in flags.FLAGS and isinstance(flags.FLAGS[name].value, str) \
        and not flags.FLAGS[name].value.strip():
      example = flags.FLAGS[name].default or 'runs'
      sys.exit(fail(f'--{name} is empty; give the directory to write to, e.g. '
                    f'--{name}={example}'))
  return rest


def _release_tff_default_context():
  """Drops TFF's import-time default context while `subprocess` still exists.

  TFF's default context owns a `ServiceManager` whose `__del__`, run when the
  interpreter tears modules down, fails with "'NoneType' object has no
  attribute 'Popen'" (printed as "Exception ignored in ..."). Releasing it
  here, before teardown, lets it be collected quietly.
  """
  if 'tensorflow_federated' in sys.modules:
    from tff_algos.runtime import context  # pylint: disable=g-import-not-at-top
    context.release_tff_default_context()


def guarded(main):
  """`main` with user errors and interrupts turned into one line each."""
  def wrapped(argv):
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
      signal.signal(signal.SIGTERM, _raise_terminated)
    try:
      return main(argv)
    except UserError as e:
      return fail(e)
    except BrokenPipeError:
      if not _stdout_closed():
        raise  # another pipe (a worker's): its traceback says which
      # stdout's reader went away (`| head`): end as SIGPIPE ends a process,
      # with one line instead of a traceback (the run's files are closed).
      devnull = os.open(os.devnull, os.O_WRONLY)
      os.dup2(devnull, sys.stdout.fileno())  # so that no later flush fails
      try:
        print('stopped: the output pipe was closed; rerun the same command to resume',
              file=sys.stderr)
      except OSError:
        pass
      return 128 + signal.SIGPIPE
    except KeyboardInterrupt as e:
      # The run has stopped: another Ctrl-C or SIGTERM ends the process as
      # the signal does by default, without a traceback of the way out.
      for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
          signal.signal(sig, signal.SIG_DFL)
      print(stop_message(e), file=sys.stderr)
      return 128 + (signal.SIGTERM if _terminated else signal.SIGINT)
  return wrapped


def _stdout_closed() -> bool:
  """Whether stdout is a pipe whose reader went away (poll: POLLERR)."""
  import select  # pylint: disable=g-import-not-at-top
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
  except (OSError, ValueError, AttributeError):
    return False


def _computation_still_running() -> bool:
  """Whether an in-process TFF call goes on on TFF's event-loop thread (the
  signal stopped only the thread that waited for it)."""
  executor = sys.modules.get('tff_algos.runtime.inprocess.executor')
  return executor is not None and executor.calls_on_loop_threads() > 0


def _exit_without_teardown(code: int) -> None:
  """Ends the process as the interpreter's exit would, less the teardown.

  What Python's exit runs that a program may rely on still runs: the
  threads' exit hooks and a join of non-daemon threads (`threading._shutdown`,
  as `Py_FinalizeEx` calls it), then the `atexit` functions (logging's flush
  among them), then the standard streams are flushed. What is skipped is
  tearing down the modules and their objects, TensorFlow's and TFF's: 1.3-1.6 s
  of a quadratic-toy run's ~8 s here, after every file of the run was closed.
  """
  import atexit  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  shutdown = getattr(threading, '_shutdown', None)
  if shutdown is None:  # another Python: let it tear down as usual
    return
  shutdown()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (BrokenPipeError, ValueError):  # a closed pipe (`| head`): nothing to say
      pass
    except OSError:  # e.g. a full disk under `> file`: as Python's own exit does
      code = 120
  os._exit(code)


def run(main):
  """`app.run(main)` for an experiment binary (see the module docstring).

  After a finished run that loaded TensorFlow it does not return: the process
  ends there (`_exit_without_teardown`), so code after it, or a caller's
  `finally`, does not run; `atexit` functions do."""
  try:
    app.run(guarded(main), flags_parser=_parse_flags)
  except SystemExit as e:
    if e.code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and _computation_still_running():
      # Tearing the interpreter down under TensorFlow's running kernels
      # crashes (SIGSEGV, or an abort with a dump while it traces). The
      # run's files are closed and its workers stopped: end here.
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(e.code)
    if e.code in (0, None) and 'tensorflow' in sys.modules:
      # A finished run whose outputs are written: skip TensorFlow's teardown
      # (`tff_algos.runtime.context`'s exit function releases TFF's context).
      _exit_without_teardown(0)
    raise
  finally:
    _release_tff_default_context()
