"""A disk that fills up, for tests: `FullDisk(root, target, nth)` makes every
write under `root` fail with ENOSPC from the `nth` write to a file whose path
contains `target` on (target None: from the first write), as a full disk
does: the write that fills it and every one after it. Writes reach it through
`open` (and `io.open`: numpy's zip files), `os.write` / `os.pwrite` (the
client-state store) and TensorFlow's `TFRecordWriter` (TensorBoard), which
raises its `ResourceExhaustedError` as TensorFlow does.

`python tests/training/full_disk.py ROOT TARGET NTH -- args...` runs
`experiments.train` with the disk filling up so.
"""

import builtins
import errno
import io
import os
import runpy
import sys


class FullDisk:

  def __init__(self, root: str, target=None, nth: int = 1):
    self.root, self.target, self.nth = os.path.abspath(str(root)), target, nth
    self.full = target is None
    self.seen = 0
    self._saved = []

  def spend(self, path: str) -> None:
    """Called before each write to `path`: raises once the disk is full."""
    path = os.path.abspath(str(path))
    if not path.startswith(self.root + os.sep):
      return
    if not self.full and self.target in path:
      self.seen += 1
      self.full = self.seen >= self.nth
    if self.full:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

  def install(self) -> 'FullDisk':
    disk, real_open = self, builtins.open
    real_write, real_pwrite = os.write, os.pwrite
    import tensorflow as tf
    real_writer = tf.io.TFRecordWriter

    def fd_path(fd):
      try:
        return os.readlink(f'/proc/self/fd/{fd}')
      except OSError:
        return ''

    def opened(file, mode='r', *args, **kwargs):
      f = real_open(file, mode, *args, **kwargs)
      if isinstance(file, (str, os.PathLike)) and any(c in mode for c in 'wax+'):
        return _File(f, lambda: disk.spend(file))
      return f

    def write(fd, data):
      disk.spend(fd_path(fd))
      return real_write(fd, data)

    def pwrite(fd, data, offset):
      disk.spend(fd_path(fd))
      return real_pwrite(fd, data, offset)

    class Writer:
      def __init__(self, path, *args, **kwargs):
        self.path, self._writer = path, real_writer(path, *args, **kwargs)

      def _spend(self):
        try:
          disk.spend(self.path)
        except OSError:
          raise tf.errors.ResourceExhaustedError(
              None, None, f'{self.path}; No space left on device') from None

      def write(self, record):
        self._spend()
        self._writer.write(record)

      def flush(self):
        self._spend()
        self._writer.flush()

      def close(self):
        try:
          self._spend()
        finally:
          self._writer.close()

    for owner, name, value in [(builtins, 'open', opened), (io, 'open', opened),
                               (os, 'write', write), (os, 'pwrite', pwrite),
                               (tf.io, 'TFRecordWriter', Writer)]:
      self._saved.append((owner, name, getattr(owner, name)))
      setattr(owner, name, value)
    return self

  def uninstall(self) -> None:
    """Space freed: writes work again."""
    for owner, name, value in reversed(self._saved):
      setattr(owner, name, value)
    self._saved = []


class _File:
  """A file object whose writes spend disk first."""

  def __init__(self, f, spend):
    self._f, self._spend = f, spend

  def write(self, data):
    self._spend()
    return self._f.write(data)

  def writelines(self, lines):
    for line in lines:
      self.write(line)

  def flush(self):
    return self._f.flush()

  def __getattr__(self, name):
    return getattr(self._f, name)

  def __iter__(self):
    return iter(self._f)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()


if __name__ == '__main__':
  root, target, nth, dash, *args = sys.argv[1:]
  assert dash == '--'
  FullDisk(root, None if target == '-' else target, int(nth)).install()
  sys.argv = ['experiments.train', *args]
  runpy.run_module('experiments.train', run_name='__main__', alter_sys=True)
