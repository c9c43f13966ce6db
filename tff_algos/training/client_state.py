"""A disk-backed store of per-client state, checkpointed with the run.

Stateful algorithms (FedDyn's grad L_k, SCAFFOLD's c_i) keep one state per
client of the population between rounds. For a real dataset that does not fit
in memory (FEMNIST: 3,400 clients x a 1.2M-parameter CNN ~ 16 GB float32), so
the store keeps every client's state as one row of a (sparse) file
`rows.f32` shaped [num_clients, row_floats] (the state's tensors flattened and
concatenated, float32) and reads / writes only the rows of a round's cohort
with positioned I/O (`os.pread` / `os.pwrite`). Nothing is memory-mapped, so
resident memory is O(cohort x state size), whatever the population size.

Rows are initialised lazily: a client that was never written reads as the
algorithm's initial client state (a bitmap `initialized` says which rows
hold data). Unselected clients' rows are never touched.

Checkpoints and exact resume. The trainer checkpoints the store at round r
(`checkpoint(r)`: data synced, the bitmap saved as `mask_<r>.npy`) together
with the server state. Rounds run after that checkpoint overwrite rows; before
the FIRST overwrite of a row since the last checkpoint, its old contents are
appended (and synced) to the undo log `undo_<r>.log`. `restore(r)` replays the
undo logs of every checkpoint >= r newest first, so the rows are exactly those
of round r even when the process ran rounds past its last checkpoint before
dying. The last two checkpoints are kept (like the server-state manager), so
a crash between the store's checkpoint and the server state's still resumes
from the previous one.

Integrity. The store keeps a CRC-32 of every written row (`sums`, in memory,
saved as `sums_<r>.npy` with each checkpoint). A row read back is checked
against it, and so is every undo entry before a restore replays any: bytes
changed outside the run (a file overwritten, bit rot, a lost undo entry) raise
`UserError` instead of feeding a different state to training. This costs one
CRC per row read or written (O(cohort) a round); the store is never scanned.
`fingerprint()` digests a checkpoint's bitmap and checksums, so the trainer's
checkpoint can vouch for the store it was taken with.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
from typing import Any, Sequence
import zlib

import numpy as np
import tensorflow as tf

from tff_algos.errors import UserError
from tff_algos.training import crash_points
from tff_algos.training import disk

_ROWS = 'rows.f32'
_HEADER = struct.Struct('<q')   # undo-log entry: row index, then the row bytes


class ClientStateStore:
  """Per-client state rows on disk, keyed by client id.

  Args:
    directory: where the store lives (created; reused if it holds a store of
      the same shape, e.g. on resume).
    client_ids: every client of the population (row i = client_ids[i]).
    initial_state: a structure of arrays, the state of a never-written client.
    keep: checkpoints kept (2: the latest and the one before).
  """

  def __init__(self, directory: str, client_ids: Sequence[str], initial_state: Any,
               keep: int = 2):
    if not client_ids:
      raise ValueError('a client-state store needs at least one client')
    if keep < 1:
      raise ValueError(f'keep must be >= 1, got {keep}')
    self.directory = directory
    self.client_ids = list(client_ids)
    self._index = {cid: i for i, cid in enumerate(self.client_ids)}
    if len(self._index) != len(self.client_ids):
      raise ValueError('client ids must be unique')
    self._template = tf.nest.map_structure(
        lambda a: np.asarray(a, np.float32), initial_state)
    flat = tf.nest.flatten(self._template)
    self._shapes = [a.shape for a in flat]
    self._sizes = [int(a.size) for a in flat]
    self._initial_row = (np.concatenate([a.ravel() for a in flat])
                         if flat else np.zeros(0, np.float32))
    self.row_floats = int(sum(self._sizes))
    self.row_bytes = 4 * self.row_floats
    self.keep = keep
    os.makedirs(directory, exist_ok=True)
    self._path = os.path.join(directory, _ROWS)
    size = len(self.client_ids) * self.row_bytes
    if os.path.exists(self._path) and os.path.getsize(self._path) != size:
      raise UserError(f'{self._path} is {os.path.getsize(self._path)} bytes, expected '
                      f'{size} for this run\'s client states (changed outside the run, '
                      'or another run\'s); restore it, or pass --restart to start over')
    self._log = None
    self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
    try:  # a store refused while it opens closes its files
      if os.fstat(self._fd).st_size != size:
        os.ftruncate(self._fd, size)    # sparse: no disk used until written
      self.initialized = np.zeros(len(self.client_ids), bool)
      self.sums = np.zeros(len(self.client_ids), np.uint32)  # CRC-32 of written rows
      self._touched: set[int] = set()
      self._round = None                # round of the last checkpoint/restore
      if self._checkpoints():           # an existing store: at its latest checkpoint
        self.restore(self._checkpoints()[-1])
      else:                             # a new store: round 0 is "nothing written"
        self.checkpoint(0)
    except BaseException:
      self.close()
      raise

  # -- rows -----------------------------------------------------------------
  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  @property
  def capacity_bytes(self) -> int:
    return self.num_clients * self.row_bytes

  def indices(self, client_ids: Sequence[str]) -> list[int]:
    try:
      return [self._index[c] for c in client_ids]
    except KeyError as e:
      raise ValueError(f'client {e.args[0]!r} is not in the store') from None

  def _read_row(self, i: int) -> np.ndarray:
    if not self.initialized[i]:
      return self._initial_row.copy()
    buf = os.pread(self._fd, self.row_bytes, i * self.row_bytes)
    if len(buf) != self.row_bytes:
      raise IOError(f'short read of client row {i}')
    if zlib.crc32(buf) != self.sums[i]:
      raise UserError(
          f'{self._path}: the state of client {self.client_ids[i]!r} does not match '
          'its checksum (the file was changed outside the run); restore the run '
          'directory from a backup, or pass --restart to start over')
    return np.frombuffer(buf, np.float32).copy()

  def _unflatten(self, row: np.ndarray) -> Any:
    parts, start = [], 0
    for shape, size in zip(self._shapes, self._sizes):
      parts.append(row[start:start + size].reshape(shape))
      start += size
    return tf.nest.pack_sequence_as(self._template, parts)

  def _flatten(self, state: Any) -> np.ndarray:
    flat = tf.nest.flatten(state)
    if len(flat) != len(self._shapes):
      raise ValueError(f'client state has {len(flat)} tensors, the store '
                       f'{len(self._shapes)}')
    out = []
    for a, shape in zip(flat, self._shapes):
      a = np.asarray(a, np.float32)
      if a.shape != shape:
        raise ValueError(f'client state tensor of shape {a.shape}, expected {shape}')
      out.append(a.ravel())
    return np.concatenate(out) if out else np.zeros(0, np.float32)

  def gather(self, client_ids: Sequence[str]) -> list[Any]:
    """The states of `client_ids` (structures like the initial state)."""
    return [self._unflatten(self._read_row(i)) for i in self.indices(client_ids)]

  def scatter(self, client_ids: Sequence[str], states: Sequence[Any]) -> None:
    """Writes the new states of `client_ids`; other rows stay untouched."""
    idx = self.indices(client_ids)
    if len(idx) != len(states):
      raise ValueError(f'{len(idx)} clients but {len(states)} states')
    if len(set(idx)) != len(idx):
      raise ValueError('a client appears twice in one scatter')
    rows = [self._flatten(s) for s in states]   # validate all before writing
    # Undo entries first (synced): the old contents of rows written for the
    # first time since the checkpoint. A row that was never written needs none
    # (the checkpoint's bitmap marks it as initial).
    fresh = [i for i in idx if i not in self._touched]
    logged = [i for i in fresh if self.initialized[i]]
    if logged:
      with disk.writing(self._log.name):  # a torn last entry is ignored by `restore`
        for i in logged:
          old = os.pread(self._fd, self.row_bytes, i * self.row_bytes)
          if len(old) != self.row_bytes:
            raise IOError(f'short read of client row {i}')
          self._log.write(_HEADER.pack(i) + old)
        self._log.flush()
        os.fsync(self._log.fileno())
    crash_points.reached('store_scatter_logged')
    self._touched.update(fresh)
    for n, (i, row) in enumerate(zip(idx, rows)):
      data = row.tobytes()
      self._write_row(i, data)
      self.initialized[i] = True
      self.sums[i] = zlib.crc32(data)
      if n == 0:
        crash_points.reached('store_scatter_rows')

  def _write_row(self, i: int, data: bytes) -> None:
    """Writes row `i` whole: a short write (a disk filling up) is continued,
    so a full disk raises `disk.NoSpace`."""
    with disk.writing(self._path):
      done = 0
      while done < len(data):
        written = os.pwrite(self._fd, data[done:], i * self.row_bytes + done)
        if written <= 0:
          raise IOError(f'short write of client row {i}')
        done += written

  # -- checkpoints ----------------------------------------------------------
  def _checkpoints(self) -> list[int]:
    rounds = []
    for path in glob.glob(os.path.join(self.directory, 'mask_*.npy')):
      m = re.fullmatch(r'mask_(\d+)\.npy', os.path.basename(path))
      if m:
        rounds.append(int(m.group(1)))
    return sorted(rounds)

  def _mask_path(self, r: int) -> str:
    return os.path.join(self.directory, f'mask_{r}.npy')

  def _sums_path(self, r: int) -> str:
    return os.path.join(self.directory, f'sums_{r}.npy')

  def _log_path(self, r: int) -> str:
    return os.path.join(self.directory, f'undo_{r}.log')

  def _remove_checkpoint(self, r: int) -> None:
    for path in (self._mask_path(r), self._sums_path(r), self._log_path(r)):
      if os.path.exists(path):
        os.remove(path)

  def _open_log(self, r: int, truncate: bool):
    if self._log is not None:
      self._log.close()
    self._log = open(self._log_path(r), 'wb' if truncate else 'ab')

  def _load(self, path: str, dtype) -> np.ndarray:
    """A checkpoint's bitmap or checksums; `UserError` if unreadable."""
    try:
      array = np.load(path)
    except Exception as e:  # pylint: disable=broad-except  (a damaged header: any error)
      raise UserError(f'{path} is unreadable ({type(e).__name__}); restore the run '
                      'directory from a backup, or pass --restart to start over') from None
    if array.shape != (self.num_clients,) or array.dtype != dtype:
      raise UserError(f'{path} holds {array.dtype}{list(array.shape)}, expected '
                      f'{np.dtype(dtype)}[{self.num_clients}]; restore the run directory '
                      'from a backup, or pass --restart to start over')
    return array

  def _checkpoint_sums(self, r: int):
    """Row checksums of checkpoint r (None: a store written before checksums)."""
    path = self._sums_path(r)
    return self._load(path, np.uint32) if os.path.exists(path) else None

  def fingerprint(self) -> int:
    """CRC-32 of the bitmap and row checksums: what a checkpoint vouches for."""
    return _fingerprint(self.initialized, self.sums)

  def checkpoint_fingerprint(self, round_num: int):
    """`fingerprint()` as it will be after `restore(round_num)`, read from that
    checkpoint's files without changing anything; None where the store has no
    such checkpoint or it predates checksums (then only `restore` can tell)."""
    if round_num not in self._checkpoints():
      return None
    sums = self._checkpoint_sums(round_num)
    if sums is None:
      return None
    return _fingerprint(self._load(self._mask_path(round_num), bool), sums)

  def checkpoint(self, round_num: int) -> int:
    """Makes the current rows the store's state at `round_num` (durably);
    returns its `fingerprint()`."""
    with disk.writing(self._path):
      os.fsync(self._fd)
    _save_durably(self._sums_path(round_num), self.sums)
    crash_points.reached('store_checkpoint')
    _save_durably(self._mask_path(round_num), self.initialized)
    self._open_log(round_num, truncate=True)
    self._touched = set()
    self._round = round_num
    for r in self._checkpoints()[:-self.keep]:
      self._remove_checkpoint(r)
    return self.fingerprint()

  def _undo_entries(self, round_num: int, rounds: list[int]) -> list[tuple[int, bytes]]:
    """The undo entries that take the rows back to `round_num`, in replay order
    (newest log first), each checked against its checkpoint's row checksum."""
    entry = _HEADER.size + self.row_bytes
    undo = []
    for r in sorted((r for r in rounds if r >= round_num), reverse=True):
      path = self._log_path(r)
      if not os.path.exists(path):
        continue
      sums = self._checkpoint_sums(r)
      with open(path, 'rb') as f:
        data = f.read()
      for k, start in enumerate(range(0, len(data) - entry + 1, entry)):  # a torn tail
        (i,) = _HEADER.unpack_from(data, start)                          # is ignored
        row = data[start + _HEADER.size:start + entry]
        if not 0 <= i < self.num_clients or (
            sums is not None and zlib.crc32(row) != sums[i]):
          raise UserError(
              f'{path}: undo entry {k + 1} is corrupt, so the client states of round '
              f'{round_num} cannot be recovered; restore the run directory from a '
              'backup, or pass --restart to start over')
        undo.append((i, row))
    return undo

  def restore(self, round_num: int) -> None:
    """Rolls the rows back to checkpoint `round_num` (undoing later writes)."""
    rounds = self._checkpoints()
    if round_num not in rounds:
      raise UserError(f'the client-state store in {self.directory} has no checkpoint '
                      f'of round {round_num} (it has {rounds}); restore it from a '
                      'backup, or pass --restart to start over')
    if self._log is not None:
      self._log.close()
      self._log = None
    for i, row in self._undo_entries(round_num, rounds):  # all checked before any write
      self._write_row(i, row)
    with disk.writing(self._path):
      os.fsync(self._fd)
    self.initialized = self._load(self._mask_path(round_num), bool)
    sums = self._checkpoint_sums(round_num)
    self.sums = sums if sums is not None else self._row_sums()
    for r in rounds:
      if r > round_num:
        self._remove_checkpoint(r)
    self._open_log(round_num, truncate=True)
    self._touched = set()
    self._round = round_num

  def _row_sums(self) -> np.ndarray:
    """Checksums of the written rows, read from disk (once, for a store
    written before checksums were kept)."""
    sums = np.zeros(self.num_clients, np.uint32)
    for i in np.flatnonzero(self.initialized):
      sums[i] = zlib.crc32(os.pread(self._fd, self.row_bytes, int(i) * self.row_bytes))
    return sums

  def reset(self) -> None:
    """Forgets every row and checkpoint (a fresh run)."""
    for r in self._checkpoints():
      self._remove_checkpoint(r)
    os.ftruncate(self._fd, 0)                     # free the disk blocks
    os.ftruncate(self._fd, self.capacity_bytes)
    self.initialized[:] = False
    self.sums[:] = 0
    self.checkpoint(0)

  def disk_bytes(self) -> int:
    """Bytes actually allocated on disk (the rows file is sparse)."""
    total = 0
    for path in glob.glob(os.path.join(self.directory, '*')):
      total += os.stat(path).st_blocks * 512
    return total

  def close(self) -> None:
    if self._log is not None:
      self._log.close()
      self._log = None
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def delete(self) -> None:
    """Closes the store and removes its directory."""
    self.close()
    shutil.rmtree(self.directory, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _fingerprint(initialized: np.ndarray, sums: np.ndarray) -> int:
  return zlib.crc32(initialized.tobytes() + sums.tobytes())


def _save_durably(path: str, array: np.ndarray) -> None:
  """np.save, synced, replacing `path` atomically."""
  def write(tmp):
    with open(tmp, 'wb') as f:
      np.save(f, array)
  disk.write_atomically(path, write)
