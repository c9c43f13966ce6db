"""Writes to a run directory that may fill up.

Every write of a run's outputs goes through `writing(path)` (or
`write_atomically`), which turns a full disk (`ENOSPC`, a quota's `EDQUOT`,
TensorFlow's `ResourceExhaustedError` for TensorBoard's files) into `NoSpace`:
one line naming the file, and the fix. `RunOutputs` tracks the round its last
complete checkpoint vouches for, and the trainer says it (`resuming_from`):
the same command, once space is freed, resumes from there exactly.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Callable, Iterator, Optional

from tff_algos.errors import UserError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class NoSpace(UserError):
  """The disk (or the user's quota) is full; `path` is the file being written."""

  def __init__(self, path: str, round_num: Optional[int] = None):
    self.path, self.round_num = path, round_num
    where = ('' if round_num is None else
             f' to resume from round {round_num}' if round_num else ' to start it again')
    super().__init__(f'no space left on device writing {path}; free space and rerun '
                     f'the same command{where}')

  def resuming_from(self, round_num: Optional[int]) -> 'NoSpace':
    return self if round_num is None else NoSpace(self.path, round_num)


def is_full(error: BaseException) -> bool:
  """Whether `error` says the disk is full."""
  if isinstance(error, OSError):
    return error.errno in FULL_ERRNOS
  return type(error).__name__ == 'ResourceExhaustedError' and (
      'space' in str(error).lower() or 'quota' in str(error).lower())


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
  """Raises `NoSpace(path)` for a full disk inside the block."""
  try:
    yield
  except NoSpace:
    raise
  except Exception as e:  # pylint: disable=broad-except  (OSError, TF's errors)
    if is_full(e):
      raise NoSpace(path) from None
    raise


def write_atomically(path: str, write: Callable[[str], None], sync: bool = True) -> None:
  """`write(tmp)` writes the new contents to a temporary file, which then
  replaces `path` (synced first when `sync`). A full disk leaves `path` as it
  was and removes the temporary file (`NoSpace`)."""
  tmp = path + '.tmp'
  try:
    with writing(path):
      write(tmp)
      if sync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
          os.fsync(fd)
        finally:
          os.close(fd)
      os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def first_error(*steps: Callable[[], None]) -> None:
  """Runs every step; raises the first step's exception (the later ones'
  are dropped: on a full disk each close fails again, and one line says it)."""
  error = None
  for step in steps:
    try:
      step()
    except BaseException as e:  # pylint: disable=broad-except
      if error is None:
        error = e
  if error is not None:
    raise error
