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
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

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
      raise ValueError(f'{directory} holds a client-state store of another shape '
                       f'({os.path.getsize(self._path)} bytes, expected {size})')
    self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
    if os.fstat(self._fd).st_size != size:
      os.ftruncate(self._fd, size)    # sparse: no disk used until written
    self.initialized = np.zeros(len(self.client_ids), bool)
    self._touched: set[int] = set()
    self._log = None
    self._round = None                # round of the last checkpoint/restore
    if self._checkpoints():           # an existing store: at its latest checkpoint
      self.restore(self._checkpoints()[-1])
    else:                             # a new store: round 0 is "nothing written"
      self.checkpoint(0)

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
      for i in logged:
        old = os.pread(self._fd, self.row_bytes, i * self.row_bytes)
        if len(old) != self.row_bytes:
          raise IOError(f'short read of client row {i}')
        self._log.write(_HEADER.pack(i) + old)
      self._log.flush()
      os.fsync(self._log.fileno())
    self._touched.update(fresh)
    for i, row in zip(idx, rows):
      written = os.pwrite(self._fd, row.tobytes(), i * self.row_bytes)
      if written != self.row_bytes:
        raise IOError(f'short write of client row {i}')
      self.initialized[i] = True

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

  def _log_path(self, r: int) -> str:
    return os.path.join(self.directory, f'undo_{r}.log')

  def _open_log(self, r: int, truncate: bool):
    if self._log is not None:
      self._log.close()
    self._log = open(self._log_path(r), 'wb' if truncate else 'ab')

  def checkpoint(self, round_num: int) -> None:
    """Makes the current rows the store's state at `round_num` (durably)."""
    os.fsync(self._fd)
    tmp = self._mask_path(round_num) + '.tmp'
    with open(tmp, 'wb') as f:
      np.save(f, self.initialized)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self._mask_path(round_num))
    self._open_log(round_num, truncate=True)
    self._touched = set()
    self._round = round_num
    for r in self._checkpoints()[:-self.keep]:
      for path in (self._mask_path(r), self._log_path(r)):
        if os.path.exists(path):
          os.remove(path)

  def restore(self, round_num: int) -> None:
    """Rolls the rows back to checkpoint `round_num` (undoing later writes)."""
    rounds = self._checkpoints()
    if round_num not in rounds:
      raise ValueError(f'the client-state store in {self.directory} has no '
                       f'checkpoint at round {round_num} (it has {rounds})')
    if self._log is not None:
      self._log.close()
      self._log = None
    entry = _HEADER.size + self.row_bytes
    for r in sorted((r for r in rounds if r >= round_num), reverse=True):
      path = self._log_path(r)
      if not os.path.exists(path):
        continue
      with open(path, 'rb') as f:
        data = f.read()
      for start in range(0, len(data) - entry + 1, entry):  # a torn tail is ignored
        (i,) = _HEADER.unpack_from(data, start)
        os.pwrite(self._fd, data[start + _HEADER.size:start + entry], i * self.row_bytes)
    os.fsync(self._fd)
    self.initialized = np.load(self._mask_path(round_num))
    for r in rounds:
      if r > round_num:
        for path in (self._mask_path(r), self._log_path(r)):
          if os.path.exists(path):
            os.remove(path)
    self._open_log(round_num, truncate=True)
    self._touched = set()
    self._round = round_num

  def reset(self) -> None:
    """Forgets every row and checkpoint (a fresh run)."""
    for r in self._checkpoints():
      for path in (self._mask_path(r), self._log_path(r)):
        if os.path.exists(path):
          os.remove(path)
    os.ftruncate(self._fd, 0)                     # free the disk blocks
    os.ftruncate(self._fd, self.capacity_bytes)
    self.initialized[:] = False
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
