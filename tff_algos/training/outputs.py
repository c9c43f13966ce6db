"""What a run keeps under its output directory, behind one object.

`RunOutputs` owns a run's identity check, its resume point, its metrics
(`metrics.csv` and TensorBoard), its checkpoints and its running totals:
`resume(state, ...)` once, then `record(row)` after every round and
`save(state, round)` at checkpoint rounds, `close()`, then
`write_summary(...)`. Without an output directory it keeps only the running
totals.

Layout: `metrics.csv` (one row per round; a resumed run first drops the rows
after its checkpoint, then appends: TFF's `CSVFileReleaseManager` does the
same but rewrites the whole file on every release, quadratic in the rounds),
TensorBoard events under `tb/` (`ScalarEvents`; what
`tff.program.TensorBoardReleaseManager` wrote, rewritten from metrics.csv when
a resume dropped rows, so no round appears twice), `checkpoints/round_N/`
(`StateManager`: the layout and retention of
`tff.program.FileProgramStateManager`, the state in one `state.npz`),
`run_identity.json` and `summary.json`. `tff_algos.training.run_dir` checks what a
resume loads.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import random
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core import accounting
from tff_algos.errors import UserError
from tff_algos.training import client_state
from tff_algos.training import crash_points
from tff_algos.training import disk
from tff_algos.training import run_dir
from tff_algos.training import summary_file
from tff_algos.training import tensorboard_events
from tff_algos.training.tensorboard_events import ScalarEvents  # pylint: disable=unused-import

_read_events = tensorboard_events.read_events  # experiments.benchmark reads events with it

# Recorded rows reach metrics.csv and TensorBoard at least this often (and at
# every checkpoint); writing them in batches keeps the writes off every round.
FLUSH_SECONDS = 5.0



def write_npz(path: str, arrays) -> None:
  """`np.savez` of `arrays` to the file `path` (no .npz added), through memory:
  a full disk then fails one plain write, where np.savez's own ZipFile, left
  open by the failure, printed a traceback when it was collected."""
  buffer = io.BytesIO()
  np.savez(buffer, *arrays)
  with open(path, 'wb') as f:
    f.write(buffer.getbuffer())

class MetricsCSV:
  """Append-only per-round CSV keyed by 'round', truncated once on resume.

  `rows_crc` is `run_dir.rows_digest` of every row written, continued from
  the one given (a checkpoint's, whose rows metrics.csv may have lost)."""

  def __init__(self, path: str, resume_round: int, read: Optional[tuple] = None,
               rows_crc: Optional[int] = None):
    """`read`: `run_dir.read_metrics_csv(path)`'s result if the caller has it."""
    self.path = path
    self.fields: list[str] = []
    rows = []
    if read is not None or os.path.exists(path):
      # UserError: a bad line
      self.fields, all_rows = read if read is not None else run_dir.read_metrics_csv(path)
      rows = [r for r in all_rows if float(r['round']) <= resume_round]
      self._rewrite(rows)  # also mends a last line cut short by a crash
    self.rows_crc = run_dir.rows_digest(rows) if rows_crc is None else rows_crc
    self.kept_rows = [{k: _parse_cell(v) for k, v in r.items() if v != ''} for r in rows]

  def _rewrite(self, rows):
    def write(tmp):
      with open(tmp, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=self.fields)
        writer.writeheader()
        writer.writerows(rows)
    disk.write_atomically(self.path, write, sync=False)

  def append(self, row: dict[str, Any]):
    self.append_rows([row])

  def append_rows(self, rows: list[dict[str, Any]]):
    """Appends `rows` in one write (the header grows to new columns first)."""
    new = list(dict.fromkeys(k for row in rows for k in row if k not in self.fields))
    if new or not os.path.exists(self.path):
      written = []
      if os.path.exists(self.path):
        with open(self.path, newline='') as f:
          written = list(csv.DictReader(f))
      self.fields += new
      self._rewrite(written)
    text = io.StringIO(newline='')
    csv.DictWriter(text, fieldnames=self.fields).writerows(rows)
    text = text.getvalue()
    with disk.writing(self.path):
      with open(self.path, 'a', newline='') as f:
        f.write(text)
    # The digest of the cells as written (and as a resume reads them back).
    cells = [dict(zip(self.fields, line)) for line in csv.reader(io.StringIO(text))]
    self.rows_crc = run_dir.rows_digest(cells, self.rows_crc)


def _parse_cell(value: str):
  try:
    return float(value)
  except ValueError:
    return value


STATE_FILE = 'state.npz'
# A checkpoint's own copy of its manifest entry (running totals, the store's
# fingerprint, metrics.csv's digest), so a resume keeps the totals also
# without checkpoints.json.
RUN_FILE = 'run.json'


class StateManager(tff.program.FileProgramStateManager):
  """Checkpoints in TFF's layout and retention (`round_N/`, written under a
  temporary name, then renamed; the newest `keep_total` kept), each holding
  the state's leaves (in `tf.nest` order) in one `state.npz`: ~1 ms to write,
  where TFF's SavedModel (a `tf.Module` of variables, traced and serialised)
  took ~100 ms. A state with a leaf numpy cannot store without pickling, and
  a checkpoint written as a SavedModel by earlier versions, use TFF's format.
  `entry` (`run_dir.sealed`) goes to `RUN_FILE` with the state.
  """

  async def save(self, program_state, version: int,
                 entry: Optional[dict[str, Any]] = None) -> None:
    path = self._get_path_for_version(version)
    if os.path.exists(path):
      raise tff.program.ProgramStateExistsError(version=version, path=self._root_dir)
    leaves = [np.asarray(leaf) for leaf in tf.nest.flatten(program_state)]
    if any(leaf.dtype == object for leaf in leaves):
      with disk.writing(path):
        await super().save(program_state, version)
        self._save_entry(path, version, entry)
      return
    temp = f'{path}_temp{random.randint(1000, 9999)}'  # run_dir removes leftovers
    shutil.rmtree(temp, ignore_errors=True)
    try:
      with disk.writing(os.path.join(path, STATE_FILE)):
        os.makedirs(temp)
        write_npz(os.path.join(temp, STATE_FILE), leaves)
        self._save_entry(temp, version, entry)
    except BaseException:  # a full disk: the space goes back
      shutil.rmtree(temp, ignore_errors=True)
      raise
    os.rename(temp, path)
    await self._remove_old_program_state()

  @staticmethod
  def _save_entry(directory: str, version: int, entry) -> None:
    if entry is not None:
      with disk.writing(os.path.join(directory, RUN_FILE)):
        with open(os.path.join(directory, RUN_FILE), 'w') as f:
          json.dump(run_dir.sealed(version, entry), f, default=str)

  def run_entry(self, version: int) -> Optional[dict[str, Any]]:
    """Checkpoint `version`'s `RUN_FILE` entry (None: an older checkpoint
    without one); `ValueError` when it is damaged."""
    path = os.path.join(self._get_path_for_version(version), RUN_FILE)
    if not os.path.exists(path):
      return None
    with open(path, 'rb') as f:
      entry = json.loads(f.read().decode())
    if not (isinstance(entry, dict) and 'crc' in entry and
            run_dir.entry_is_sound(version, entry)):
      raise ValueError(f'{path} does not match its checksum')
    return entry

  async def load(self, version: int, structure):
    path = os.path.join(self._get_path_for_version(version), STATE_FILE)
    if not os.path.exists(path):
      return await super().load(version, structure)  # a SavedModel, or missing
    template = [np.asarray(leaf) for leaf in tf.nest.flatten(structure)]
    with np.load(path, allow_pickle=False) as saved:
      leaves = [saved[f'arr_{i}'] for i in range(len(saved.files))]
    if len(leaves) != len(template) or any(
        a.shape != t.shape or a.dtype != t.dtype for a, t in zip(leaves, template)):
      raise run_dir.StateStructureError(f'{path} does not hold a state of this run\'s '
                                        'structure')
    # Scalars as numpy scalars, as TFF's loader gives them.
    return tf.nest.pack_sequence_as(structure, [a[()] if a.ndim == 0 else a
                                                for a in leaves])


class RunOutputs:
  """A run's outputs under `out_dir` (None: nothing on disk) and its running
  totals: the cost columns' (`cumulative`) and summary.json's (`totals`).

  Construction checks the run's `identity` against the directory's (a
  different run there is refused). Then `resume`, and per round `record` and,
  at checkpoint rounds, `save`.
  """

  def __init__(self, out_dir: Optional[str], identity: dict[str, Any]):
    self.out_dir = out_dir
    self.state_manager = self.csv = self.tensorboard = self.manifest = None
    self.store = None  # the client-state store a checkpoint also vouches for
    self.resumed: Optional[dict[str, Any]] = None  # the checkpoint's manifest entry
    # The round a rerun resumes from: the last checkpoint vouched for (None:
    # not known yet), what a full disk's refusal says.
    self.checkpointed: Optional[int] = None
    self._metrics_read = None  # metrics.csv as `resume` read it, for `open_rows`
    self.kept_rows: list[dict[str, Any]] = []  # metrics.csv's rows up to it, parsed
    self.cumulative = accounting.CumulativeCost()
    self.totals = run_dir.summary_totals(())
    self.last_row: Optional[dict[str, Any]] = None
    self._unwritten: list[dict[str, Any]] = []  # recorded rows not yet on disk
    self._unwritten_times: list[float] = []  # and their wall times
    self._written_at = time.monotonic()
    self._runner: Optional[asyncio.Runner] = None  # see `_run`
    if out_dir:
      with disk.writing(out_dir):
        os.makedirs(out_dir, exist_ok=True)
      self.state_manager = StateManager(
          os.path.join(out_dir, 'checkpoints'), prefix='round_', keep_total=2,
          keep_first=False)
      _check_identity(os.path.join(out_dir, 'run_identity.json'), identity)

  def resume(self, state, total_rounds: int) -> tuple[Any, int]:  # pylint: disable=too-many-locals
    """(state, round) to start from: the newest intact checkpoint's, else
    (`state`, 0). Changes nothing on disk: `open_rows` (after the client-state
    store, which may still refuse the directory) drops the rows past it."""
    if not self.out_dir:
      return state, 0
    self.manifest = run_dir.Manifest(self.out_dir)
    state, start_round, entry = _resume_point(self.state_manager, self._run, self.manifest,
                                              state, self.out_dir, total_rounds)
    # The manifest's entry, else the checkpoint's own copy (None: fresh, or older dir).
    self.resumed = self.manifest.entries.get(start_round) or entry
    csv_path = os.path.join(self.out_dir, 'metrics.csv')
    # A bad line refused now, before any change; `open_rows` keeps what was read.
    self._metrics_read = (run_dir.read_metrics_csv(csv_path) if os.path.exists(csv_path)
                          else None)
    kept = [r for r in (self._metrics_read or ([], []))[1] if float(r['round']) <= start_round]
    run_dir.check_rows(csv_path, kept, start_round, self.resumed)
    self.checkpointed = start_round
    return state, start_round

  def open_rows(self, start_round: int) -> None:
    """Opens the metrics outputs at `start_round` (rows past it dropped) and
    continues the running totals: from the checkpoint's manifest entry
    (metrics.csv may have lost rows), else from the rows kept in metrics.csv."""
    if not self.out_dir:
      return
    self.csv = MetricsCSV(os.path.join(self.out_dir, 'metrics.csv'), start_round,
                          read=self._metrics_read,
                          rows_crc=(self.resumed or {}).get('rows_crc'))
    self._metrics_read = None
    self.kept_rows = self.csv.kept_rows
    self.tensorboard = tensorboard_events.open_events(os.path.join(self.out_dir, 'tb'), start_round)
    self.cumulative = accounting.CumulativeCost(() if self.resumed else self.kept_rows)
    self.totals = run_dir.summary_totals(() if self.resumed else self.kept_rows)
    if self.resumed:
      self.cumulative.totals.update(self.resumed['cumulative'])
      self.totals.update(self.resumed['totals'])
      _note_lost_rows(self.csv.path, self.kept_rows, start_round)

  def open_store(self, initial_state, client_ids, start_round: int) -> None:
    """The run's client-state store at round `start_round` (temporary without
    an output directory), checked against the checkpoint's fingerprint."""
    fingerprint = (self.resumed or {}).get('store')
    directory = (os.path.join(self.out_dir, 'client_state') if self.out_dir
                 else tempfile.mkdtemp(prefix='client_state_'))
    store = client_state.ClientStateStore(directory, client_ids, initial_state)
    try:  # a refusal, the store's own included, closes its files
      if start_round == 0:
        store.reset()
      else:
        # Checked before `restore`, which drops the store's later checkpoints:
        # a refused store is left as it was (only its own crash recovery, done
        # when it was opened, has run).
        if fingerprint is not None and store.checkpoint_fingerprint(start_round) not in (
            None, fingerprint):
          self._refuse_store(directory, start_round)
        store.restore(start_round)
        if fingerprint is not None and store.fingerprint() != fingerprint:
          self._refuse_store(directory, start_round)
    except BaseException:
      store.close()
      raise
    self.store = store

  @staticmethod
  def _refuse_store(directory: str, start_round: int):
    raise UserError(f'{directory} does not match the checkpoint of round '
                    f'{start_round} (its bitmap or checksums were changed); restore '
                    f'it from a backup, or {run_dir.restart_fix()}')

  def close(self) -> None:
    """Writes the rows not yet written and closes the TensorBoard file and
    the client-state store (a temporary one is removed); every step runs, the
    first failure is raised."""
    disk.first_error(lambda: self.csv is not None and self.flush(),
                     self._close_tensorboard, self._close_store, self._close_runner)

  def _close_tensorboard(self) -> None:
    tensorboard, self.tensorboard = self.tensorboard, None
    if tensorboard is not None:
      tensorboard.close()

  def _run(self, coroutine):
    """Runs one of the state manager's coroutines on the run's event loop.

    One loop for the run: `asyncio.run` made a loop per call, and with it the
    thread pool that TFF's file functions run on, then joined it. A checkpoint
    (TFF's save, which lists the versions three times, and the listing for the
    manifest) took 2.1 ms that way and 1.0 ms on one loop (measured here).
    `close` closes the loop; `training.run_training` calls it also when the
    directory is refused.
    """
    if self._runner is None:
      self._runner = asyncio.Runner()
    return self._runner.run(coroutine)

  def _close_runner(self) -> None:
    if self._runner is not None:
      self._runner.close()
      self._runner = None

  def _close_store(self) -> None:
    if self.store is not None:
      self.store.close()
      if not self.out_dir:
        shutil.rmtree(self.store.directory, ignore_errors=True)

  def record(self, row: dict[str, Any]) -> None:
    """Adds a finished round's row to the totals and to the rows that `flush`
    writes: at each checkpoint (before it, so what a checkpoint vouches for is
    on disk), at the end, and whenever `FLUSH_SECONDS` passed since the last
    write. A crash loses only rows after the last checkpoint, which a resume
    runs again."""
    run_dir.add_to_totals(self.totals, row)
    self.last_row = row
    if self.csv is None:
      return
    self._unwritten.append({k: v for k, v in row.items() if isinstance(v, (int, float))})
    self._unwritten_times.append(time.time())
    if time.monotonic() - self._written_at >= FLUSH_SECONDS:
      self.flush()

  def flush(self) -> None:
    """Writes the recorded rows: metrics.csv in one append, then TensorBoard."""
    rows, self._unwritten = self._unwritten, []
    wall_times, self._unwritten_times = self._unwritten_times, []
    self._written_at = time.monotonic()
    if not rows:
      return
    self.csv.append_rows(rows)
    for _ in rows:
      crash_points.reached('metrics_row')
    self.tensorboard.write(rows, wall_times)

  def save(self, state, round_num: int) -> bool:
    """Checkpoints round `round_num`: the client store, the server state, then
    the manifest entry that vouches for both and for the running totals (a
    crash in between resumes from the previous checkpoint). False: no
    output directory, nothing saved."""
    if self.state_manager is None:
      return False
    self.flush()
    entry = dict(cumulative=dict(self.cumulative.totals), totals=dict(self.totals),
                 row=run_dir.finite_scalars(self.last_row or {}), rows_crc=self.csv.rows_crc)
    if self.store is not None:
      with disk.writing(self.store.directory):
        entry['store'] = self.store.checkpoint(round_num)
    crash_points.reached('checkpoint_state')
    self._run(self.state_manager.save(state, round_num, entry))
    crash_points.reached('checkpoint_manifest')
    self.manifest.record(round_num, entry, self._run(self.state_manager.get_versions()) or [])
    self.checkpointed = round_num
    return True

  def final_row(self) -> Optional[dict[str, Any]]:
    """The run's last row: this call's, else the checkpoint's, else metrics.csv's."""
    return self.last_row or (self.resumed or {}).get('row') or (
        self.kept_rows[-1] if self.kept_rows else None)

  def write_summary(self, summary: dict[str, Any], weights) -> None:
    """summary.json and final_weights.npz (the model's trainable weights)."""
    if not self.out_dir:
      return
    def write_json(tmp):
      with open(tmp, 'w') as f:
        json.dump(summary_file.sealed(summary), f, indent=2)
    disk.write_atomically(os.path.join(self.out_dir, 'summary.json'), write_json)
    def write_weights(tmp):
      write_npz(tmp, [np.asarray(w) for w in weights.trainable])
    disk.write_atomically(os.path.join(self.out_dir, 'final_weights.npz'), write_weights)


def _resume_point(state_manager, run: Callable[[Any], Any], manifest: run_dir.Manifest,
                  state, out_dir: str, total_rounds: int) -> tuple[Any, int, Any]:
  """(state, round, the checkpoint's `RUN_FILE` entry) to start from: the
  newest intact checkpoint, else (`state`, 0, None) (`run` runs the state
  manager's coroutines)."""
  versions = run(state_manager.get_versions()) or []
  loaded, start_round = run_dir.select_checkpoint(
      out_dir, versions, manifest, lambda version: (run(state_manager.load(version, state)),
                                                    state_manager.run_entry(version)))
  if start_round > total_rounds:
    raise UserError(f'{out_dir} holds a run checkpointed at round '
                    f'{start_round}, past {run_dir.FLAG_NAMES["rounds"]}={total_rounds}; '
                    f'raise {run_dir.FLAG_NAMES["rounds"]}, or {run_dir.restart_fix()}')
  if loaded is None:
    return state, 0, None
  loaded_state, entry = loaded
  return loaded_state, start_round, entry


def _note_lost_rows(path: str, kept_rows, start_round: int) -> None:
  have = {int(r['round']) for r in kept_rows}
  lost = [r for r in range(1, start_round + 1) if r not in have]
  if lost:
    run_dir.notice(f'{path} lacks {len(lost)} of rounds 1-{start_round} (first: round '
                   f'{lost[0]}); resuming from round {start_round}, totals kept from '
                   'the checkpoint')


# Identity entries that older run directories lack: compared where stored.
COMPARED_WHEN_STORED = ('algorithm_defaults',)


def _identity_diff(stored: dict[str, Any], ident: dict[str, Any], most: int = 4) -> str:
  """'key (old there, new here), ...' of the entries that differ ('' if none);
  a dict entry (the task's info, the traffic) by its differing keys, so that
  '--emnist_model' reads as task_info.model ('cnn' there, 'cnn_dropout' here),
  not as 'task_info'."""
  default = object()  # an identity leaves out the flags at their defaults

  def short(value):
    text = 'the default' if value is default else repr(value)
    return text if len(text) <= 40 else text[:37] + '...'

  items = []
  for key in sorted(set(stored) | set(ident)):
    if key in COMPARED_WHEN_STORED and key not in stored:
      continue  # written by a version that did not record it
    old, new = stored.get(key, default), ident.get(key, default)
    if old == new:
      continue
    if isinstance(old, dict) and isinstance(new, dict):
      items += [(f'{key}.{k}', old.get(k, default), new.get(k, default))
                for k in sorted(set(old) | set(new)) if old.get(k, default) != new.get(k, default)]
    else:
      items.append((key, old, new))
  said = [f'{k} ({short(o)} there, {short(n)} here)' for k, o, n in items[:most]]
  if len(items) > most:
    said.append(f'{len(items) - most} more')
  return ', '.join(said)


def _check_identity(path: str, ident: dict[str, Any]) -> None:
  """Stores the run's identity, or refuses a directory that holds another run
  (or an identity file that is not one)."""
  if os.path.exists(path):
    try:
      with open(path, 'rb') as f:
        stored = json.loads(f.read().decode())
      if not isinstance(stored, dict):
        raise ValueError('not an object')
    except (OSError, ValueError) as e:
      raise UserError(f'{path} is unreadable ({type(e).__name__}), so this run cannot be '
                      'told apart from the one there; restore it from a backup, or '
                      f'{run_dir.restart_fix()}') from None
    diff = _identity_diff(stored, ident)
    if diff:
      raise UserError(
          f'{os.path.dirname(path)} holds a different run (differs in: '
          f'{diff}); choose another {run_dir.FLAG_NAMES["name"]}, or '
          f'{run_dir.restart_fix()}')
  else:
    def write(tmp):
      with open(tmp, 'w') as f:
        json.dump(ident, f, indent=2, sort_keys=True)
    disk.write_atomically(path, write)
