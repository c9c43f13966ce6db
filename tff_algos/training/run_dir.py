"""A run directory: its lock, its checkpoint manifest, where a resume starts.

* `lock(out_dir)`: one run at a time per directory. An exclusive `flock` on
  `run.lock`, held for the whole run; the kernel drops it when the holder ends
  in any way (`kill -9` included), so a stale lock never blocks anyone.
* `Manifest` (`checkpoints.json`): for each kept checkpoint (round N), the
  CRC-32 of every file of `checkpoints/round_N/`, the client-state store's
  fingerprint, the run's running totals and round N's metrics row. Written
  (atomically) after the checkpoint itself, so a checkpoint without an entry
  was cut short; it lets a resume check what it loads, continue the totals
  when metrics.csv is lost, and notice that `checkpoints/` itself is gone.
* `select_checkpoint`: the newest intact checkpoint; newer damaged ones are
  moved aside to `round_N.corrupt` with a one-line notice.
* `read_metrics_csv`: metrics.csv's rows, refusing a garbage line by number.
* `clear(out_dir)`: what `--restart` removes.
* `signals_deferred()`: holds Ctrl-C / SIGTERM back while a checkpoint is
  written, so a stop never leaves the newest checkpoint cut short.

Every problem a user can fix raises `UserError` with one line.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
from typing import Any, Callable, Iterator, Optional
import zlib

from tff_algos.errors import UserError
from tff_algos.training import disk

LOCK_FILE = 'run.lock'
MANIFEST_FILE = 'checkpoints.json'
CHECKPOINT_DIR = 'checkpoints'
CHECKPOINT_PREFIX = 'round_'
_RESTART_FIX = 'pass {} to delete its outputs and start the run over'
RESTART_FIX = _RESTART_FIX.format('--restart')  # as the trainer says it
# The flags a refusal tells the user to change, as the running binary names
# them: a grid's runs are named by --grid_name, not --experiment_name
# (`set_flag_names`).
FLAG_NAMES = dict(name='--experiment_name', rounds='--total_rounds', restart='--restart')


def set_flag_names(**names: str) -> None:
  """The running binary's names of the flags that refusals advise (keys of
  `FLAG_NAMES`: name, rounds, restart)."""
  unknown = set(names) - set(FLAG_NAMES)
  if unknown:
    raise ValueError(f'unknown flag roles {sorted(unknown)}; known: {sorted(FLAG_NAMES)}')
  FLAG_NAMES.update(names)


def restart_fix() -> str:
  """`RESTART_FIX` in the running binary's words."""
  return _RESTART_FIX.format(FLAG_NAMES['restart'])


STRUCTURE_PROBLEM = 'holds a state of another structure'


class StateStructureError(ValueError):
  """A checkpoint whose state is not shaped like this build's: written by
  another version of this library (or another algorithm's build)."""
# What --restart removes: every output of a run (curves.png: the binaries').
ARTEFACTS = ('metrics.csv', 'metrics.csv.tmp', MANIFEST_FILE, 'summary.json',
             'final_weights.npz', 'run_identity.json', 'curves.png', CHECKPOINT_DIR,
             'client_state', 'tb')
# summary.json's totals: (name, metrics column).
SUMMARY_TOTALS = (('client_steps', 'client_work/client_steps'),
                  ('download_bytes', 'download_bytes'), ('upload_bytes', 'upload_bytes'),
                  ('client_flops', 'client_flops'), ('round_time_s', 'round_time_s'))


def notice(message: str) -> None:
  print(f'note: {message}', file=sys.stderr, flush=True)


def unusable_dir(out_dir: str, error: OSError, flag: str = 'root_output_dir') -> UserError:
  """The refusal of an output directory that cannot be made or written."""
  return UserError(f'cannot use the output directory {out_dir} ({error.strerror}); '
                   f'choose another --{flag}')


@contextlib.contextmanager
def lock(out_dir: Optional[str]) -> Iterator[None]:
  """Holds `out_dir`'s run lock (nothing without a directory); a second
  holder is refused at once."""
  if not out_dir:
    yield
    return
  try:
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, LOCK_FILE), 'a+')
  except OSError as e:
    if disk.is_full(e):
      raise disk.NoSpace(os.path.join(out_dir, LOCK_FILE)) from None
    raise unusable_dir(out_dir, e) from None
  try:
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or 'unknown'
      raise UserError(f'{out_dir} is in use by another run (pid {holder}); wait for '
                      f'it to end, or choose another {FLAG_NAMES["name"]}') from None
    with disk.writing(f.name):  # the holder's pid, for a refusal to name
      f.seek(0)
      f.truncate()
      f.write(f'{os.getpid()}\n')
      f.flush()
    yield
  finally:
    f.close()  # closing the last descriptor releases the lock


def check_free(out_dir: str) -> None:
  """Refuses at once (`UserError`) when another run holds `out_dir`, before a
  binary spends time building its algorithm; `run_training` locks it for real."""
  with lock(out_dir):
    pass


def clear(out_dir: str) -> None:
  """Removes a run's outputs (`--restart`), saying so; other files are left alone."""
  removed = []
  for name in ARTEFACTS:
    path = os.path.join(out_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)
    else:
      continue
    removed.append(name)
  if removed:
    notice(f'--restart removed the earlier run in {out_dir} ({", ".join(removed)})')


def file_sums(directory: str) -> dict[str, int]:
  """CRC-32 of every file under `directory`, by relative path."""
  sums = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      crc = 0
      with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
          crc = zlib.crc32(chunk, crc)
      sums[os.path.relpath(path, directory)] = crc
  return sums


def checkpoint_path(out_dir: str, round_num: int) -> str:
  return os.path.join(out_dir, CHECKPOINT_DIR, f'{CHECKPOINT_PREFIX}{round_num}')


class Manifest:
  """`checkpoints.json`: round -> what that checkpoint vouches for."""

  def __init__(self, out_dir: str):
    self.out_dir = out_dir
    self.path = os.path.join(out_dir, MANIFEST_FILE)
    self.entries: dict[int, dict[str, Any]] = {}
    if os.path.exists(self.path):
      try:
        with open(self.path, 'rb') as f:
          self.entries = {int(r): e for r, e in json.loads(f.read().decode()).items()}
      except (OSError, ValueError, AttributeError) as e:
        raise UserError(f'{self.path} is unreadable ({type(e).__name__}); delete it to '
                        f'resume without checking the checkpoints, or {restart_fix()}'
                        ) from None
      for round_num, entry in self.entries.items():
        if not entry_is_sound(round_num, entry):
          raise UserError(f'{self.path} is damaged (its entry of round {round_num} does '
                          'not match its checksum); delete it to resume without checking '
                          f'the checkpoints, or {restart_fix()}')

  def record(self, round_num: int, entry: dict[str, Any], kept: list[int]) -> None:
    """Adds checkpoint `round_num`'s entry (its files are summed here) and
    forgets checkpoints not in `kept`."""
    entry = sealed(round_num, dict(entry, files=file_sums(checkpoint_path(self.out_dir,
                                                                          round_num))))
    self.entries = {r: e for r, e in self.entries.items() if r in kept}
    self.entries[round_num] = entry
    self._write()

  def forget_after(self, round_num: int) -> None:
    if any(r > round_num for r in self.entries):
      self.entries = {r: e for r, e in self.entries.items() if r <= round_num}
      self._write()

  def _write(self):
    def write(tmp):
      with open(tmp, 'w') as f:
        json.dump({str(r): e for r, e in sorted(self.entries.items())}, f, indent=1,
                  default=_json_number)
    disk.write_atomically(self.path, write)

  def damage(self, round_num: int) -> Optional[str]:
    """Why checkpoint `round_num` cannot be trusted (None: it can, or it
    predates the manifest)."""
    if not self.entries:
      return None  # a run directory written before manifests: load and see
    entry = self.entries.get(round_num)
    if entry is None:
      return 'was cut short (no manifest entry)'
    directory = checkpoint_path(self.out_dir, round_num)
    found = file_sums(directory)
    for name, crc in sorted(entry['files'].items()):
      if name not in found:
        return f'lacks {os.path.join(directory, name)}'
      if found[name] != crc:
        return f'has a damaged {os.path.join(directory, name)} (checksum mismatch)'
    return None


def _json_number(value):
  """JSON for numpy scalars (rows carry them)."""
  return value.item() if hasattr(value, 'item') else str(value)


# The keys of a manifest entry (a `sealed` one adds 'crc'; 'rows_crc' is
# metrics.csv's `rows_digest` up to the checkpoint).
ENTRY_KEYS = frozenset({'cumulative', 'totals', 'row', 'store', 'files', 'rows_crc'})


def _entry_crc(round_num: int, entry: dict[str, Any]) -> int:
  body = {k: v for k, v in entry.items() if k != 'crc'}
  return zlib.crc32(json.dumps([round_num, body], sort_keys=True,
                               default=_json_number).encode())


def sealed(round_num: int, entry: dict[str, Any]) -> dict[str, Any]:
  """`entry` (as JSON gives it back) with its CRC-32, which covers its round."""
  entry = json.loads(json.dumps(entry, default=_json_number))
  return dict(entry, crc=_entry_crc(round_num, entry))


def entry_is_sound(round_num: int, entry) -> bool:
  """Whether `entry` is a checkpoint's entry as written: its checksum holds
  (an entry written before checksums: its keys and their types)."""
  if not isinstance(entry, dict) or not set(entry) <= ENTRY_KEYS | {'crc'}:
    return False
  if 'crc' in entry:
    return entry['crc'] == _entry_crc(round_num, entry)
  return all(isinstance(entry.get(k), dict) for k in ('cumulative', 'totals', 'files')) and (
      all(isinstance(v, (int, float)) for k in ('cumulative', 'totals')
          for v in entry[k].values()))


def select_checkpoint(out_dir: str, versions: list[int], manifest: Manifest,
                      load: Callable[[int], Any]) -> tuple[Any, int]:
  """(state, round) of the newest intact checkpoint, or (None, 0) for none.

  Damaged or cut-short checkpoints newer than it are moved aside (their
  directory renamed `round_N.corrupt`) with a notice. Refuses (`UserError`)
  when checkpoints existed but none is usable.
  """
  _remove_unfinished(os.path.join(out_dir, CHECKPOINT_DIR))
  if not versions:
    if manifest.entries:
      last = max(manifest.entries)
      raise UserError(f'{os.path.join(out_dir, CHECKPOINT_DIR)} is missing, but '
                      f'{MANIFEST_FILE} says the run reached round {last}; restore it '
                      f'to resume, or {restart_fix()}')
    return None, 0
  problems = []
  for version in sorted(versions, reverse=True):
    problem = manifest.damage(version)
    if problem is None:
      try:
        state = load(version)
      except StateStructureError:
        problem = STRUCTURE_PROBLEM
      except Exception as e:  # pylint: disable=broad-except  (any unreadable file)
        problem = f'is unreadable ({type(e).__name__})'
    if problem is None:
      for bad, why in problems:
        _move_aside(out_dir, bad)
        notice(f'checkpoint of round {bad} {why}; resuming from round {version} '
               f'(it is kept as {checkpoint_path(out_dir, bad)}.corrupt)')
      for lost in sorted((r for r in manifest.entries if r > version and r not in versions),
                         reverse=True):  # its whole directory gone: said, not skipped
        notice(f'checkpoint of round {lost} is missing ({checkpoint_path(out_dir, lost)}, '
               f'listed in {MANIFEST_FILE}); resuming from round {version}')
      manifest.forget_after(version)
      return state, version
    problems.append((version, problem))
  if all(why == STRUCTURE_PROBLEM for _, why in problems):
    raise UserError(f'the checkpoints in {os.path.join(out_dir, CHECKPOINT_DIR)} hold a '
                    'state shaped unlike this build\'s (written by another version of '
                    'tff-algos?); resume with the version that wrote them, or '
                    f'{restart_fix()}')
  detail = '; '.join(f'round {v} {why}' for v, why in problems)
  raise UserError(f'no intact checkpoint in {os.path.join(out_dir, CHECKPOINT_DIR)} '
                  f'({detail}); restore it from a backup, or {restart_fix()}')


def _remove_unfinished(directory: str) -> None:
  """Removes the temporary directories of checkpoint writes cut short
  (TFF writes `round_N_tempXXXX`, then renames it `round_N`)."""
  if os.path.isdir(directory):
    for name in os.listdir(directory):
      if re.fullmatch(CHECKPOINT_PREFIX + r'\d+_temp\d+', name):
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _move_aside(out_dir: str, version: int) -> None:
  path = checkpoint_path(out_dir, version)
  target = path + '.corrupt'
  if os.path.exists(target):
    shutil.rmtree(target)
  os.rename(path, target)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
  """Defers SIGINT and SIGTERM to the end of the block: there, the first one
  that arrived goes to the handler that was in place (which may raise
  KeyboardInterrupt). Only the main thread handles signals; elsewhere nothing
  changes. (`kill -9` cannot be deferred; the manifest covers it.)"""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  pending = []
  previous = {}
  deferring = [True]

  def deliver(signum, frame):
    handler = previous[signum]
    if callable(handler):
      handler(signum, frame)
    else:  # SIG_DFL
      signal.signal(signum, handler)
      signal.raise_signal(signum)

  def defer(signum, frame):
    if deferring[0]:
      pending.append((signum, frame))
    else:  # left in place by a signal that cut the restoring short
      deliver(signum, frame)

  try:
    for sig in (signal.SIGINT, signal.SIGTERM):
      handler = signal.getsignal(sig)
      if handler in (signal.SIG_IGN, None):  # ignored, or set outside Python
        continue
      previous[sig] = handler
      signal.signal(sig, defer)
    yield
  finally:
    deferring[0] = False
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    if pending:
      deliver(*pending[0])


def read_metrics(path: str) -> list[dict[str, Any]]:
  """Rows of a metrics.csv: numbers as floats, empty cells left out; a
  garbage line refused as `read_metrics_csv` refuses it (no TensorFlow:
  `python -m experiments.report` reads runs with it)."""
  return [{k: float(v) for k, v in row.items() if v != ''}
          for row in read_metrics_csv(path)[1]]


def read_metrics_csv(path: str) -> tuple[list[str], list[dict[str, str]]]:
  """(header, rows) of a metrics.csv, rounds increasing.

  A last line without its newline (a write cut short by a crash) is dropped;
  any other line that is not UTF-8 text of a row of numbers raises
  `UserError` naming the file and the line.
  """
  with open(path, 'rb') as f:
    raw = f.read().split(b'\n')
  raw.pop()  # after the last newline: '' or a torn line
  lines = []
  for number, line in enumerate(raw, start=1):
    try:
      lines.append(line.decode('utf-8').rstrip('\r'))
    except UnicodeDecodeError:
      _garbage(path, number, repr(line)[2:-1], 'not UTF-8 text')
  if not lines or not lines[0]:
    return [], []
  header = next(csv.reader([lines[0]]))
  if 'round' not in header or len(set(header)) != len(header):
    _garbage(path, 1, lines[0], 'not a header with one "round" column and distinct names')
  rows, last = [], 0
  for number, line in enumerate(lines[1:], start=2):
    cells = next(csv.reader([line]), [])
    if len(cells) != len(header):
      _garbage(path, number, line, f'{len(cells)} fields, the header has {len(header)}')
    for cell in cells:
      if cell and not _is_number(cell):
        _garbage(path, number, line, f'{cell[:20]!r} is not a number')
    row = dict(zip(header, cells))
    round_num = float(row['round'] or 'nan')
    if not (round_num > last and round_num == int(round_num)):
      _garbage(path, number, line, f'round {row["round"] or "(empty)"} after round {last}')
    last = int(round_num)
    rows.append(row)
  return header, rows


def rows_digest(rows, crc: int = 0) -> int:
  """CRC-32 of metrics rows (dicts of the cells as metrics.csv holds them),
  continuing `crc`: each row's non-empty cells, by column name, so a header
  grown by new columns does not change it."""
  for row in rows:
    text = '\x1f'.join(f'{k}={v}' for k, v in sorted(row.items()) if v not in ('', None))
    crc = zlib.crc32((text + '\n').encode(), crc)
  return crc


def check_rows(path: str, rows, round_num: int, entry: Optional[dict[str, Any]],
               rebuild: bool = True) -> None:
  """Refuses metrics.csv's `rows` up to the checkpoint of `round_num` when
  they all survive but differ from what the checkpoint's `entry` vouches for
  (changed outside the run), or (`rebuild`: the totals are rebuilt from them)
  when rows are lost and no entry keeps the totals."""
  complete = [int(float(r['round'])) for r in rows] == list(range(1, round_num + 1))
  if entry is not None and 'rows_crc' in entry and complete and (
      rows_digest(rows) != entry['rows_crc']):
    raise UserError(f'{path}: rows 1-{round_num} do not match the checkpoint of round '
                    f'{round_num} (changed outside the run); restore it from a backup, '
                    'or delete it to resume without its rows (the checkpoint keeps the '
                    'totals)')
  if entry is None and rebuild and round_num and not complete:
    raise UserError(f'{path} lacks rows of rounds 1-{round_num} and the checkpoint of '
                    f'round {round_num} keeps no totals (written by an older version), '
                    "so the run's totals cannot be rebuilt; restore it from a backup, "
                    f'or {restart_fix()}')


def _is_number(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True


def _garbage(path, number, line, why):
  raise UserError(f'{path}, line {number}: not a metrics row ({why}: {line[:40]!r}); '
                  'delete or repair that line and rerun (totals are kept in the '
                  'checkpoints)')


def summary_totals(rows) -> dict[str, float]:
  """summary.json's totals over metrics rows."""
  totals = {name: 0.0 for name, _ in SUMMARY_TOTALS}
  for row in rows:
    add_to_totals(totals, row)
  return totals


def add_to_totals(totals: dict[str, float], row) -> None:
  for name, col in SUMMARY_TOTALS:
    value = row.get(col, 0.0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      totals[name] = float(totals[name] + value)


def finite_scalars(row) -> dict[str, float]:
  return {k: v for k, v in row.items()
          if isinstance(v, (int, float)) and math.isfinite(v)}
