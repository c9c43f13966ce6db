"""The disk-backed client-state store: rows, lazy init, checkpoints, undo."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import open_files_under
from tff_algos.errors import UserError
from tff_algos.training import client_state

IDS = [f'c{i}' for i in range(6)]
INITIAL = [np.full((2, 3), 0.5, np.float32), np.arange(4, dtype=np.float32)]


def state(value):
  return [np.full((2, 3), value, np.float32), np.full(4, -value, np.float32)]


def assert_state(got, value):
  want = INITIAL if value is None else state(value)
  assert len(got) == len(want)
  for a, b in zip(got, want):
    assert np.asarray(a).dtype == b.dtype and np.shape(a) == b.shape
    np.testing.assert_array_equal(a, b)


def test_rows_start_at_the_initial_state_and_only_written_rows_change(tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  assert store.row_floats == 10 and store.capacity_bytes == 6 * 40
  for s in store.gather(IDS):
    assert_state(s, None)
  store.scatter(['c4', 'c1'], [state(4.0), state(1.0)])
  got = dict(zip(IDS, store.gather(IDS)))
  assert_state(got['c4'], 4.0)
  assert_state(got['c1'], 1.0)
  for cid in ('c0', 'c2', 'c3', 'c5'):
    assert_state(got[cid], None)
  store.scatter(['c1'], [state(7.0)])
  assert_state(store.gather(['c1'])[0], 7.0)
  assert_state(store.gather(['c4'])[0], 4.0)
  store.close()


def test_bad_input_is_refused(tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  with pytest.raises(ValueError):
    store.gather(['nobody'])
  with pytest.raises(ValueError):
    store.scatter(['c0'], [[np.zeros((3, 2), np.float32), np.zeros(4, np.float32)]])
  with pytest.raises(ValueError):
    store.scatter(['c0', 'c0'], [state(1.0), state(2.0)])
  with pytest.raises(UserError, match='no checkpoint of round 7'):
    store.restore(7)
  store.close()
  with pytest.raises(UserError, match='pass --restart'):  # another shape, same directory
    client_state.ClientStateStore(str(tmp_path), IDS, [np.zeros(3, np.float32)])


def test_restore_undoes_rounds_past_the_checkpoint(tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  store.scatter(['c0', 'c1'], [state(1.0), state(1.0)])     # round 1
  store.checkpoint(1)
  store.scatter(['c1', 'c2'], [state(2.0), state(2.0)])     # round 2
  store.scatter(['c1', 'c3'], [state(3.0), state(3.0)])     # round 3 (c1 twice)
  store.checkpoint(3)
  store.scatter(['c0', 'c3', 'c4'], [state(4.0)] * 3)       # round 4, then "dies"
  del store  # no close: the process died; a new one opens the directory

  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  store.restore(3)
  got = dict(zip(IDS, store.gather(IDS)))
  for cid, value in (('c0', 1.0), ('c1', 3.0), ('c2', 2.0), ('c3', 3.0),
                     ('c4', None), ('c5', None)):
    assert_state(got[cid], value)
  # The checkpoint before is still there (a crash between the store's and the
  # server state's checkpoints resumes from it).
  store.scatter(['c2'], [state(9.0)])
  store.restore(1)
  got = dict(zip(IDS, store.gather(IDS)))
  for cid, value in (('c0', 1.0), ('c1', 1.0), ('c2', None), ('c3', None),
                     ('c4', None)):
    assert_state(got[cid], value)
  with pytest.raises(UserError):  # later checkpoints are gone after a restore
    store.restore(3)
  store.reset()
  for s in store.gather(IDS):
    assert_state(s, None)
  store.close()


def test_store_is_sparse_and_keeps_two_checkpoints(tmp_path):
  ids = [str(i) for i in range(1000)]
  big = [np.zeros(25_000, np.float32)]  # 100 KB a client, 100 MB capacity
  store = client_state.ClientStateStore(str(tmp_path), ids, big)
  for r in range(1, 5):
    store.scatter(ids[r:r + 3], [[np.full(25_000, r, np.float32)]] * 3)
    store.checkpoint(r)
  assert sorted(os.listdir(tmp_path)) == ['mask_3.npy', 'mask_4.npy', 'rows.f32',
                                          'sums_3.npy', 'sums_4.npy', 'undo_3.log',
                                          'undo_4.log']
  assert store.capacity_bytes == 100_000_000
  assert store.disk_bytes() < 3_000_000     # ~6 written rows + logs, not 100 MB
  store.delete()
  assert not os.path.exists(tmp_path)


@pytest.mark.slow
def test_client_state_benchmark_runs_with_bounded_memory(tmp_path):
  # 340 clients of the FEMNIST CNN (1.1 GB of client state), every row written.
  out = subprocess.run(
      [sys.executable, '-m', 'experiments.client_state_benchmark',
       '--num_clients=340', '--clients_per_round=10', '--rounds=3',
       f'--store_dir={tmp_path}/store', '--fill'],
      capture_output=True, text=True, timeout=1200,
      env=dict(os.environ, PYTHONPATH='.'))
  assert out.returncode == 0, out.stderr[-3000:]
  lines = dict(l.split(': ', 1) for l in out.stdout.splitlines() if ': ' in l)
  assert float(lines['peak_rss_total_gb']) < 4.0
  assert float(lines['store_capacity_gb']) > 1.0
  assert lines['resume_check'] == 'exact'
  assert not os.path.exists(tmp_path / 'store')


def _overwrite(path, offset, data):
  with open(path, 'r+b') as f:
    f.seek(offset)
    f.write(data)


def test_a_row_changed_outside_the_store_is_refused_when_read(tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  store.scatter(['c1', 'c2'], [state(1.0), state(2.0)])
  store.checkpoint(1)
  store.close()
  _overwrite(tmp_path / 'rows.f32', 1 * 40 + 4, np.float32(1.5).tobytes())  # c1's row
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  assert_state(store.gather(['c2'])[0], 2.0)  # untouched rows still read
  with pytest.raises(UserError, match="rows.f32: the state of client 'c1' does not match"):
    store.gather(['c1'])
  store.close()


def test_a_corrupt_undo_entry_is_refused_before_any_row_is_rolled_back(tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  store.scatter(['c0', 'c1'], [state(1.0), state(1.0)])
  store.checkpoint(1)
  store.scatter(['c0', 'c1'], [state(2.0), state(2.0)])  # logs round 1's c0, c1
  store.close()
  entry = 8 + 40
  _overwrite(tmp_path / 'undo_1.log', entry + 8, np.float32(7.0).tobytes())  # 2nd entry
  rows_before = (tmp_path / 'rows.f32').read_bytes()
  with pytest.raises(UserError, match=r'undo_1.log: undo entry 2 is corrupt'):
    client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  assert (tmp_path / 'rows.f32').read_bytes() == rows_before
  assert open_files_under(tmp_path) == []  # the refused store closed its files



def test_fingerprint_follows_the_checkpoint_and_a_store_without_sums_is_summed_once(
    tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  store.scatter(['c3'], [state(3.0)])
  at_1 = store.checkpoint(1)
  store.scatter(['c4'], [state(4.0)])
  assert store.checkpoint(2) != at_1
  store.restore(1)
  assert store.fingerprint() == at_1
  store.close()
  os.remove(tmp_path / 'sums_1.npy')  # a store written before checksums existed
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  assert store.fingerprint() == at_1  # recomputed from the rows
  assert_state(store.gather(['c3'])[0], 3.0)
  store.close()


def test_a_checkpoints_fingerprint_is_read_without_restoring(tmp_path):
  """`checkpoint_fingerprint(r)` is the fingerprint `restore(r)` leads to, read
  from checkpoint r's files with nothing written or removed."""
  store = client_state.ClientStateStore(str(tmp_path), IDS, INITIAL)
  store.scatter(['c3'], [state(3.0)])
  at_1 = store.checkpoint(1)
  store.scatter(['c4'], [state(4.0)])
  at_2 = store.checkpoint(2)
  store.scatter(['c3', 'c5'], [state(-3.0), state(5.0)])  # past the last checkpoint
  files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
  assert (store.checkpoint_fingerprint(1), store.checkpoint_fingerprint(2)) == (at_1, at_2)
  assert store.checkpoint_fingerprint(3) is None
  assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
  store.restore(1)
  assert store.fingerprint() == at_1
  store.close()
