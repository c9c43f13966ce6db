"""Fault injection: a run killed anywhere, or whose files were damaged, ends in
an exact resume, a rollback to an intact checkpoint, an exact rebuild, or a
one-line refusal -- never in a silently different result.

In-process cases (FedAvg and FedDyn with its disk store, on the test session's
C++ worker) damage a copy of a run that died in round 5 (checkpoints at rounds
2 and 4, round 5's client states already written) and resume it to round 6;
the binary's cases SIGKILL `experiments.train` at named points
(`tff_algos.training.crash_points`) on both backends and resume it. Every resumed
or rebuilt run is compared with one uninterrupted run per algorithm and backend.
"""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import open_files_under
from paths import ROOT
from tasks import TaskOptions, get_task
from tff_algos.errors import UserError
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams
from tff_algos.training import crash_points
from tff_algos.training import loop as training, outputs as run_outputs, run_dir

ROUNDS = 6
ALGORITHMS = ('fedavg', 'feddyn')


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=10, model='logistic'))


@pytest.fixture(scope='module')
def algorithms(task):
  return {name: algorithm_flags.build(name, task.model_fn, algorithm_flags.for_algorithm(
      name, HParams(local_steps=3, feddyn_alpha=0.1))) for name in ALGORITHMS}


def config(out, rounds=ROUNDS, restart=False):
  return training.RunConfig(total_rounds=rounds, clients_per_round=5, seed=0,
                            rounds_per_eval=3, rounds_per_checkpoint=2, output_dir=out,
                            progress=False, restart=restart)


class Died(Exception):
  pass


def _die_in_5(done, state, row):
  if done == 5:  # round 5's client states are written, its row is not
    raise Died()


@pytest.fixture(scope='module')
def runs(task, algorithms, tmp_path_factory):
  """name -> (uninterrupted run dir, its result, run dir that died in round 5)."""
  out = {}
  for name, algorithm in algorithms.items():
    root = tmp_path_factory.mktemp(name)
    full = training.run_training(algorithm, task, config(str(root / 'full')))
    with pytest.raises(Died):
      training.run_training(algorithm, task, config(str(root / 'died')),
                            round_callback=_die_in_5)
    out[name] = (root / 'full', full, root / 'died')
  return out


def damaged_copy(runs, name, tmp_path, which='died'):
  full, _, died = runs[name]
  out = tmp_path / 'run'
  shutil.copytree(died if which == 'died' else full, out)
  return out


def resume(algorithms, task, name, out, rounds=ROUNDS):
  return training.run_training(algorithms[name], task, config(str(out), rounds))


def metrics(path):
  _, rows = run_dir.read_metrics_csv(str(path / 'metrics.csv'))
  return [{k: v for k, v in r.items() if k != 'round_time_s'} for r in rows]


def tensorboard_values(path):
  """(step, tag) -> value of every scalar in the run's event files; a repeated
  (step, tag) fails."""
  import tensorflow as tf
  from tensorflow.core.util import event_pb2
  values = {}
  for events in sorted((path / 'tb').glob('events.out.tfevents.*')):
    for record in tf.data.TFRecordDataset(str(events)):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        key = (event.step, value.tag)
        assert key not in values, f'{key} logged twice'
        values[key] = float(tf.make_ndarray(value.tensor))
  return values


def assert_tensorboard_has_every_row_once(out, reference):
  """TensorBoard holds each of the reference run's metrics rows exactly once,
  with its values (as float32; round_time_s is wall time and differs), even
  where `out`'s metrics.csv lost rows."""
  _, rows = run_dir.read_metrics_csv(str(reference / 'metrics.csv'))
  expected = {(int(r['round']), k): float(np.float32(float(v)))
              for r in rows for k, v in r.items() if k != 'round' and v != ''}
  found = tensorboard_values(out)
  assert sorted(found) == sorted(expected)
  keys = [k for k in sorted(expected) if k[1] != 'round_time_s']
  np.testing.assert_array_equal([found[k] for k in keys], [expected[k] for k in keys])


def summary(path):
  with open(path / 'summary.json') as f:
    s = json.load(f)
  totals = {k: v for k, v in s['totals'].items() if k != 'round_time_s'}
  return totals, {k: v for k, v in s['final_train'].items() if k != 'round_time_s'}


def assert_same_model(runs, name, out, result=None):
  """Bit-identical to the uninterrupted run: weights, client states, and
  the metrics rows that survived."""
  full, full_result, _ = runs[name]
  saved, ref = np.load(out / 'final_weights.npz'), np.load(full / 'final_weights.npz')
  for key in ref.files:
    np.testing.assert_array_equal(saved[key], ref[key])
  if result is not None:
    for a, b in zip(result.model_weights.trainable, full_result.model_weights.trainable):
      np.testing.assert_array_equal(a, b)
  if name == 'feddyn':
    assert (out / 'client_state' / 'rows.f32').read_bytes() == \
        (full / 'client_state' / 'rows.f32').read_bytes()
  ref_rows = {r['round']: r for r in metrics(full)}
  for row in metrics(out):
    assert row == ref_rows[row['round']]
  assert summary(out) == summary(full)
  assert_tensorboard_has_every_row_once(out, full)


def _truncate(path, keep_bytes):
  with open(path, 'r+b') as f:
    f.truncate(keep_bytes)


def _flip_byte(path, offset):
  data = bytearray(path.read_bytes())
  data[offset] ^= 0xFF
  path.write_bytes(bytes(data))


def _variables(out, round_num):
  return out / 'checkpoints' / f'round_{round_num}' / run_outputs.STATE_FILE


# -- kill mid-round and resume ------------------------------------------------
@pytest.mark.parametrize('name', ALGORITHMS)
def test_a_run_that_died_mid_round_resumes_exactly(runs, algorithms, task, tmp_path, name):
  out = damaged_copy(runs, name, tmp_path)
  result = resume(algorithms, task, name, out)
  assert result.resumed_from == 4
  assert_same_model(runs, name, out, result)


# -- Ctrl-C during a checkpoint's write -----------------------------------------
@pytest.fixture
def python_sigint():
  """Python's own Ctrl-C handler for the test (the runtime's would also stop
  the session's TFF context), the previous one restored after."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize('name', ALGORITHMS)
def test_ctrl_c_while_a_checkpoint_is_written_keeps_it(runs, algorithms, task, tmp_path,
                                                        monkeypatch, python_sigint, name):
  """The signal waits for the checkpoint (state, store and manifest entry):
  the stop names it, and the resume starts from it, bit-identically."""
  save = run_outputs.RunOutputs.save

  def interrupted_save(self, state, round_num):
    if round_num == 4:
      os.kill(os.getpid(), signal.SIGINT)  # lands inside the write
    return save(self, state, round_num)

  monkeypatch.setattr(run_outputs.RunOutputs, 'save', interrupted_save)
  out = tmp_path / 'run'
  with pytest.raises(training.Stopped, match=r'^stopped after round 4; rerun the same '
                     r'command to resume$'):
    training.run_training(algorithms[name], task, config(str(out)))
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
  monkeypatch.undo()
  assert run_dir.Manifest(str(out)).damage(4) is None
  result = resume(algorithms, task, name, out)
  assert result.resumed_from == 4
  assert_same_model(runs, name, out, result)


def test_crash_point_specs(monkeypatch):
  for spec, target in [('metrics_row', ('metrics_row', 1, signal.SIGKILL)),
                       ('store_checkpoint:3', ('store_checkpoint', 3, signal.SIGKILL)),
                       ('metrics_row:5:stop', ('metrics_row', 5, signal.SIGSTOP))]:
    monkeypatch.setenv(crash_points.ENV, spec)
    assert crash_points._target() == target  # pylint: disable=protected-access
  monkeypatch.setenv(crash_points.ENV, 'metrics_row:5:pause')
  with pytest.raises(ValueError, match='must be "stop"'):
    crash_points._target()  # pylint: disable=protected-access
  monkeypatch.delenv(crash_points.ENV)
  assert crash_points._target() is None  # pylint: disable=protected-access


def test_signals_deferred_delivers_the_first_signal_at_the_end(python_sigint):
  seen = []
  with pytest.raises(KeyboardInterrupt):
    with run_dir.signals_deferred():
      os.kill(os.getpid(), signal.SIGINT)
      os.kill(os.getpid(), signal.SIGINT)
      seen.append('block ran to its end')
  assert seen == ['block ran to its end']
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_deferring_handler_left_in_place_delivers_like_the_one_it_replaced(python_sigint):
  # A signal that cuts the restoring short leaves the other signal's deferring
  # handler installed; once the block is over it must not swallow signals.
  with pytest.raises(KeyboardInterrupt):  # the deferred one, at the block's end
    with run_dir.signals_deferred():
      deferring = signal.getsignal(signal.SIGINT)
      assert deferring is not signal.default_int_handler
      deferring(signal.SIGINT, None)
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  with pytest.raises(KeyboardInterrupt):
    deferring(signal.SIGINT, None)  # after the block: the replaced handler's way


# -- damaged checkpoints: roll back to the newest intact one -------------------
@pytest.mark.parametrize('name,damage', [
    ('fedavg', 'truncate'), ('feddyn', 'truncate'), ('fedavg', 'flip'), ('feddyn', 'flip'),
    ('fedavg', 'unfinished')])
def test_a_damaged_latest_checkpoint_rolls_back_to_the_previous_one(
    runs, algorithms, task, tmp_path, capsys, name, damage):
  out = damaged_copy(runs, name, tmp_path)
  if damage == 'truncate':
    _truncate(_variables(out, 4), 10)
  elif damage == 'flip':  # same size, one byte changed
    _flip_byte(_variables(out, 4), 3)
  else:  # the state saved, the manifest entry not: the write was cut short
    manifest = json.loads((out / run_dir.MANIFEST_FILE).read_text())
    del manifest['4']
    (out / run_dir.MANIFEST_FILE).write_text(json.dumps(manifest))
  result = resume(algorithms, task, name, out)
  assert result.resumed_from == 2  # and the store rolled back over two undo logs
  notes = [l for l in capsys.readouterr().err.splitlines() if l.startswith('note:')]
  assert len(notes) == 1 and 'checkpoint of round 4' in notes[0]
  assert 'resuming from round 2' in notes[0]
  assert (out / 'checkpoints' / 'round_4.corrupt').is_dir()
  assert_same_model(runs, name, out, result)


def test_a_missing_latest_checkpoint_directory_is_said(runs, algorithms, task, tmp_path,
                                                       capsys):
  """The newest checkpoint's whole directory gone (not a file in it): the run
  resumes from the previous one exactly as before, and says so (it said
  nothing, unlike for a missing file)."""
  out = damaged_copy(runs, 'fedavg', tmp_path)
  shutil.rmtree(out / 'checkpoints' / 'round_4')
  result = resume(algorithms, task, 'fedavg', out)
  assert result.resumed_from == 2
  notes = [l for l in capsys.readouterr().err.splitlines() if l.startswith('note:')]
  assert len(notes) == 1 and 'checkpoint of round 4 is missing' in notes[0], notes
  assert 'resuming from round 2' in notes[0]
  assert_same_model(runs, 'fedavg', out, result)


def test_every_file_of_a_checkpoint_is_vouched_for(runs, algorithms, task, tmp_path,
                                                   capsys):
  ckpt = runs['fedavg'][2] / 'checkpoints' / 'round_4'
  files = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob('*') if p.is_file())
  assert files == [run_outputs.RUN_FILE, run_outputs.STATE_FILE]
  for i, name in enumerate(files):
    out = damaged_copy(runs, 'fedavg', tmp_path / str(i))
    _flip_byte(out / 'checkpoints' / 'round_4' / name, 0)
    result = resume(algorithms, task, 'fedavg', out)
    assert result.resumed_from == 2, name
    assert name in capsys.readouterr().err
    assert_same_model(runs, 'fedavg', out, result)


def test_no_intact_checkpoint_is_refused_naming_the_files(runs, algorithms, task, tmp_path):
  out = damaged_copy(runs, 'fedavg', tmp_path)
  _truncate(_variables(out, 4), 10)
  _flip_byte(_variables(out, 2), 3)
  with pytest.raises(UserError, match=r'no intact checkpoint .*round 4 has a damaged '
                     r'.*round_4/state.npz.*round 2 .*--restart'):
    resume(algorithms, task, 'fedavg', out)


def test_a_leftover_temporary_checkpoint_is_removed(runs, algorithms, task, tmp_path):
  # A kill inside TFF's checkpoint write leaves round_N_tempXXXX behind.
  out = damaged_copy(runs, 'fedavg', tmp_path)
  shutil.copytree(out / 'checkpoints' / 'round_4', out / 'checkpoints' / 'round_6_temp1234')
  result = resume(algorithms, task, 'fedavg', out)
  assert result.resumed_from == 4
  assert sorted(os.listdir(out / 'checkpoints')) == ['round_4', 'round_6']
  assert_same_model(runs, 'fedavg', out, result)


def test_a_legacy_run_without_a_manifest_resumes_exactly(runs, algorithms, task, tmp_path):
  out = damaged_copy(runs, 'feddyn', tmp_path)
  os.remove(out / run_dir.MANIFEST_FILE)
  for sums in (out / 'client_state').glob('sums_*.npy'):
    os.remove(sums)  # a store from before row checksums
  result = resume(algorithms, task, 'feddyn', out)
  assert result.resumed_from == 4
  assert_same_model(runs, 'feddyn', out, result)  # totals rebuilt from metrics.csv


def test_an_unreadable_manifest_is_refused(runs, algorithms, task, tmp_path):
  out = damaged_copy(runs, 'fedavg', tmp_path)
  (out / run_dir.MANIFEST_FILE).write_text('{"4": ')
  with pytest.raises(UserError, match='checkpoints.json is unreadable'):
    resume(algorithms, task, 'fedavg', out)


def test_a_checkpoint_of_another_state_structure_is_refused_as_such(runs, task, tmp_path):
  """A run whose checkpoints hold a state shaped unlike this build's (e.g. one
  written before the client schedule's numbers moved into the state) is not
  called damaged: the refusal names the cause, and nothing is moved aside."""
  out = damaged_copy(runs, 'fedavg', tmp_path)
  epochs = algorithm_flags.build('fedavg', task.model_fn, HParams())  # no K_0 in its state
  with pytest.raises(UserError, match="shaped unlike this build's.*another version"):
    training.run_training(epochs, task, config(str(out)))
  assert not list((out / 'checkpoints').glob('*.corrupt'))


def test_a_checkpoint_saved_as_a_savedmodel_resumes_exactly(runs, algorithms, task,
                                                            tmp_path):
  # Earlier versions saved the state with TFF's FileProgramStateManager (a
  # SavedModel); their runs must still resume, bit-identically.
  import asyncio
  import tensorflow_federated as tff
  out = damaged_copy(runs, 'feddyn', tmp_path)
  template, _ = training._initial_state(algorithms['feddyn'], task, config(None), None)
  ours = run_outputs.StateManager(str(out / 'checkpoints'), prefix='round_')
  state = asyncio.run(ours.load(4, template))
  legacy = tff.program.FileProgramStateManager(str(tmp_path / 'legacy'), prefix='round_')
  asyncio.run(legacy.save(state, 4))
  shutil.rmtree(out / 'checkpoints' / 'round_4')
  shutil.copytree(tmp_path / 'legacy' / 'round_4', out / 'checkpoints' / 'round_4')
  assert (out / 'checkpoints' / 'round_4' / 'saved_model.pb').exists()
  manifest = run_dir.Manifest(str(out))  # its entry vouches for the SavedModel's files
  entry = {k: v for k, v in manifest.entries[4].items() if k != 'files'}
  manifest.record(4, entry, list(manifest.entries))
  result = resume(algorithms, task, 'feddyn', out)
  assert result.resumed_from == 4
  assert_same_model(runs, 'feddyn', out, result)


# -- checkpoints lost, metrics kept: refuse, or --restart ----------------------
def test_lost_checkpoints_are_refused_and_restart_starts_over(runs, algorithms, task,
                                                               tmp_path, capsys):
  out = damaged_copy(runs, 'feddyn', tmp_path)
  shutil.rmtree(out / 'checkpoints')
  with pytest.raises(UserError, match=r'checkpoints is missing, but checkpoints.json says '
                     r'the run reached round 4; .*--restart'):
    resume(algorithms, task, 'feddyn', out)
  assert len(metrics(out)) == 4  # nothing was dropped
  capsys.readouterr()
  result = training.run_training(algorithms['feddyn'], task, config(str(out), restart=True))
  assert result.resumed_from == 0
  assert_same_model(runs, 'feddyn', out, result)
  # The restart says what it removed (it had done so silently).
  note = [l for l in capsys.readouterr().err.splitlines() if '--restart removed' in l]
  assert len(note) == 1 and 'metrics.csv' in note[0] and str(out) in note[0], note


def test_checkpoint_past_total_rounds_is_refused(runs, algorithms, task, tmp_path):
  out = damaged_copy(runs, 'fedavg', tmp_path)
  with pytest.raises(UserError, match='checkpointed at round 4, past --total_rounds=3'):
    resume(algorithms, task, 'fedavg', out, rounds=3)


def test_a_run_s_checkpoints_share_one_event_loop_closed_at_the_end(
    runs, algorithms, task, tmp_path, monkeypatch):
  """TFF's state manager is asynchronous; a run runs its coroutines on one
  event loop (`asyncio.run` made one, with a thread pool, per call), closed
  with the run's outputs, and also when the directory is refused."""
  runners = []

  class Recorded(run_outputs.asyncio.Runner):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      runners.append(self)

  monkeypatch.setattr(run_outputs.asyncio, 'Runner', Recorded)
  out = tmp_path / 'run'
  training.run_training(algorithms['fedavg'], task, config(str(out)))
  assert len(runners) == 1  # the resume check and 3 checkpoints
  with pytest.raises(UserError, match='past --total_rounds'):
    training.run_training(algorithms['fedavg'], task, config(str(out), rounds=2))
  assert len(runners) == 2
  lines = (out / 'metrics.csv').read_text().splitlines(keepends=True)
  lines[3] = lines[2]  # refused after the checkpoint is read: metrics.csv
  (out / 'metrics.csv').write_text(''.join(lines))
  with pytest.raises(UserError, match='metrics.csv, line 4'):
    training.run_training(algorithms['fedavg'], task, config(str(out), rounds=8))
  assert len(runners) == 3
  for runner in runners:
    with pytest.raises(RuntimeError, match='closed'):
      runner.get_loop()


# -- metrics.csv lost or damaged: totals survive, garbage is named -------------
@pytest.mark.parametrize('name,damage', [('fedavg', 'delete'), ('feddyn', 'truncate'),
                                         ('fedavg', 'torn')])
def test_lost_metrics_rows_keep_the_totals(runs, algorithms, task, tmp_path, capsys,
                                           name, damage):
  out = damaged_copy(runs, name, tmp_path)
  path = out / 'metrics.csv'
  lines = path.read_text().splitlines(keepends=True)
  if damage == 'delete':
    os.remove(path)
  elif damage == 'truncate':
    path.write_text(''.join(lines[:3]))  # header, rounds 1 and 2
  else:  # round 5's row cut short by the crash: dropped, no row lost
    path.write_text(''.join(lines) + '5,0.12')
  result = resume(algorithms, task, name, out)
  assert result.resumed_from == 4
  full_rows = {r['round']: r for r in metrics(runs[name][0])}
  rows = metrics(out)
  for row in rows:  # cum_* continue from the checkpoint, not from 0
    assert row == full_rows[row['round']]
  assert rows[-1]['round'] == '6'
  err = capsys.readouterr().err
  assert ('lacks' in err) == (damage != 'torn')
  assert_same_model(runs, name, out, result)  # summary totals too


def test_a_finished_run_without_metrics_csv_reruns_and_reports_without_it(
    runs, algorithms, task, tmp_path, capsys):
  out = damaged_copy(runs, 'fedavg', tmp_path, which='full')
  os.remove(out / 'metrics.csv')
  result = resume(algorithms, task, 'fedavg', out)
  assert result.resumed_from == ROUNDS and not result.history
  assert summary(out) == summary(runs['fedavg'][0])  # totals from the checkpoint
  from experiments import report
  report.print_run_results(str(out), result.final_eval)
  printed = capsys.readouterr()
  assert 'metrics.csv is missing or empty, so no table or figure' in printed.err
  assert 'final eval: ' in printed.out and 'loss=' in printed.out
  assert not (out / 'curves.png').exists()


@pytest.mark.parametrize('line,why', [('abc,def\n', 'fields'),
                                      (None, 'is not a number'), (None, 'round 2 after')])
def test_a_garbage_metrics_line_is_refused_naming_file_and_line(
    runs, algorithms, task, tmp_path, line, why):
  out = damaged_copy(runs, 'fedavg', tmp_path)
  path = out / 'metrics.csv'
  lines = path.read_text().splitlines(keepends=True)
  if why == 'is not a number':
    line = lines[3].replace(lines[3].split(',')[1], 'x1e', 1)
  elif why == 'round 2 after':
    line = lines[2]  # a repeated row, as two runs writing at once left
  lines[3] = line
  path.write_text(''.join(lines))
  with pytest.raises(UserError, match=rf'metrics.csv, line 4: not a metrics row .*{why}'):
    resume(algorithms, task, 'fedavg', out)


# -- summary.json: an output, rebuilt exactly ----------------------------------
@pytest.mark.parametrize('also_metrics', [False, True])
def test_a_damaged_summary_is_rebuilt_exactly(runs, algorithms, task, tmp_path,
                                              also_metrics):
  out = damaged_copy(runs, 'feddyn', tmp_path, which='full')
  (out / 'summary.json').write_text('{"totals": {"client_st')
  if also_metrics:
    os.remove(out / 'metrics.csv')
  result = resume(algorithms, task, 'feddyn', out)
  assert result.resumed_from == ROUNDS and result.history == []
  assert summary(out) == summary(runs['feddyn'][0])


# -- the client-state store changed outside the run: refused -------------------
@pytest.mark.parametrize('damage', ['rows', 'undo', 'mask', 'deleted'])
def test_a_changed_client_store_is_refused(runs, algorithms, task, tmp_path, damage):
  out = damaged_copy(runs, 'feddyn', tmp_path)
  store = out / 'client_state'
  if damage == 'rows':  # filled with other bytes
    size = (store / 'rows.f32').stat().st_size
    (store / 'rows.f32').write_bytes(np.random.default_rng(0).bytes(size))
    match = r'rows.f32: the state of client .* does not match its checksum'
  elif damage == 'undo':
    _flip_byte(store / 'undo_4.log', 20)
    match = r'undo_4.log: undo entry 1 is corrupt'
  elif damage == 'mask':
    mask = np.load(store / 'mask_4.npy')
    mask[np.flatnonzero(~mask)[0]] = True
    np.save(store / 'mask_4.npy', mask)
    match = r'client_state does not match the checkpoint of round 4'
  else:
    shutil.rmtree(store)
    match = r'has no checkpoint of round 4'
  with pytest.raises(UserError, match=match + r'.*--restart'):
    resume(algorithms, task, 'feddyn', out)


def test_a_refused_client_store_keeps_its_later_checkpoints(runs, algorithms, task, tmp_path):
  """A store that does not match the run's checkpoint is refused before it is
  rolled back to it, which would delete the store's later checkpoints."""
  out = damaged_copy(runs, 'feddyn', tmp_path)
  store = out / 'client_state'
  for kind in ('mask', 'sums'):  # a later checkpoint 6, the rows as at round 4
    shutil.copy(store / f'{kind}_4.npy', store / f'{kind}_6.npy')
  (store / 'undo_6.log').write_bytes(b'')
  mask = np.load(store / 'mask_4.npy')
  mask[np.flatnonzero(~mask)[0]] = True
  np.save(store / 'mask_4.npy', mask)
  before = {p.name: p.read_bytes() for p in store.iterdir() if p.name != 'rows.f32'}
  with pytest.raises(UserError, match=r'client_state does not match the checkpoint of round 4'):
    resume(algorithms, task, 'feddyn', out)
  assert {p.name: p.read_bytes() for p in store.iterdir() if p.name != 'rows.f32'} == before


def test_a_refused_client_store_leaves_the_rows_past_the_checkpoint(
    runs, algorithms, task, tmp_path):
  """The store is checked before metrics.csv and TensorBoard drop the rows
  past the checkpoint: a refusal changes neither (the rows went first)."""
  out = damaged_copy(runs, 'feddyn', tmp_path)
  path = out / 'metrics.csv'
  lines = path.read_text().splitlines(keepends=True)
  assert lines[-1].startswith('4,')  # died in round 5: checkpoint and rows at 4
  lines.append('5' + lines[-1][1:])  # a row written past it, as before a crash
  path.write_text(''.join(lines))
  before = {p: p.read_bytes() for p in [path, *(out / 'tb').iterdir()]}
  shutil.rmtree(out / 'client_state')
  with pytest.raises(UserError, match=r'has no checkpoint of round 4'):
    resume(algorithms, task, 'feddyn', out)
  assert {p: p.read_bytes() for p in [path, *(out / 'tb').iterdir()]} == before
  assert open_files_under(out) == []  # the store's own refusal closed its files


# -- two runs in one directory --------------------------------------------------
def test_a_second_run_in_the_same_directory_is_refused(runs, algorithms, task, tmp_path):
  out = damaged_copy(runs, 'fedavg', tmp_path)
  refusals = []

  def start_another(done, state, row):
    if done == 5:
      with pytest.raises(UserError, match=r'is in use by another run \(pid \d+\)') as e:
        resume(algorithms, task, 'fedavg', out)
      refusals.append(str(e.value))

  result = training.run_training(algorithms['fedavg'], task, config(str(out)),
                                 round_callback=start_another)
  assert len(refusals) == 1
  assert_same_model(runs, 'fedavg', out, result)  # the first run was not disturbed
  # The lock went with the run: the directory is free again.
  assert resume(algorithms, task, 'fedavg', out).resumed_from == ROUNDS


# -- bad inputs rejected by flag validation ---------------------------------------
@pytest.mark.parametrize('flag,message', [
    ('--experiment_name=..', 'not . or ..'), ('--experiment_name=.', 'not . or ..'),
    ('--experiment_name=a/b', 'one directory name'),
    ('--total_rounds=0', 'total_rounds must be >= 1')])
def test_bad_run_directory_flags_are_rejected(flag, message):
  from absl import flags
  from experiments.lib import flags as trainer_flags
  import experiments.train  # noqa: F401  (defines the binary's own flags)
  FLAGS = flags.FLAGS
  FLAGS.unparse_flags()
  try:
    FLAGS(['train', flag])
    with pytest.raises(trainer_flags.FlagError, match=message):
      trainer_flags.validate()
  finally:
    FLAGS.unparse_flags()


# -- the binary: SIGKILL at named points, then the same command ----------------
BACKENDS = ('inprocess', 'cpp')


def train(root, name, algorithm, backend, crash=None, extra=(), wait=True):
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop(crash_points.ENV, None)
  if crash:
    env[crash_points.ENV] = crash
  cmd = [sys.executable, '-m', 'experiments.train', '--task=digits', '--model=logistic',
         '--num_clients=10', '--clients_per_round=5', '--client_batch_size=16',
         '--local_steps=3', '--rounds_per_eval=3', '--rounds_per_checkpoint=2',
         f'--total_rounds={ROUNDS}', '--noprogress', f'--algorithm={algorithm}',
         f'--backend={backend}', f'--root_output_dir={root}', f'--experiment_name={name}',
         *(['--feddyn_alpha=0.1'] if algorithm == 'feddyn' else []), *extra]
  if not wait:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=900)


@pytest.fixture(scope='module')
def references(runs, tmp_path_factory):
  """(algorithm, backend) -> an uninterrupted run of the binary (made once); on
  the C++ worker, the library's run in this session (the same worker binary)."""
  root, made = tmp_path_factory.mktemp('binary'), {}

  def get(algorithm, backend):
    if backend == 'cpp':
      return runs[algorithm][0]
    if (algorithm, backend) not in made:
      res = train(root, f'{algorithm}_{backend}', algorithm, backend)
      assert res.returncode == 0, res.stderr[-3000:]
      made[algorithm, backend] = root / f'{algorithm}_{backend}'
    return made[algorithm, backend]
  return get


def assert_same_as(reference, out, algorithm):
  saved, ref = np.load(out / 'final_weights.npz'), np.load(reference / 'final_weights.npz')
  for key in ref.files:
    np.testing.assert_array_equal(saved[key], ref[key])
  assert metrics(out) == metrics(reference)
  assert summary(out) == summary(reference)
  assert_tensorboard_has_every_row_once(out, reference)
  if algorithm == 'feddyn':
    assert (out / 'client_state' / 'rows.f32').read_bytes() == \
        (reference / 'client_state' / 'rows.f32').read_bytes()


def one_error_line(res, text):
  """Exit status 2 and one `error:` line that says `text`; no traceback."""
  assert res.returncode == 2, res.stderr[-3000:]
  errors = [l for l in res.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and text in errors[0], res.stderr[-3000:]
  # (TFF's ServiceManager.__del__ noise at exit is the binaries' top level's to silence.)
  assert 'Traceback' not in res.stderr.split('Exception ignored in')[0], res.stderr[-3000:]


KILLS = [('fedavg', 'metrics_row:5'), ('fedavg', 'checkpoint_state:2'),
         ('fedavg', 'checkpoint_manifest:2'), ('feddyn', 'store_scatter_logged:5'),
         ('feddyn', 'store_scatter_rows:5'), ('feddyn', 'store_checkpoint:2'),
         ('feddyn', 'checkpoint_manifest:3')]


@pytest.mark.parametrize('algorithm,crash,backend', [
    pytest.param(a, c, b, marks=pytest.mark.slow)
    for a, c in KILLS for b in BACKENDS])
def test_a_run_killed_at_a_crash_point_resumes_bit_identically(
    references, tmp_path, algorithm, crash, backend):
  killed = train(tmp_path, 'run', algorithm, backend, crash=crash)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert not os.path.exists(tmp_path / 'run' / 'final_weights.npz')
  resumed = train(tmp_path, 'run', algorithm, backend)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert_same_as(references(algorithm, backend), tmp_path / 'run', algorithm)


def test_the_binary_refuses_a_locked_directory_in_one_line(tmp_path):
  (tmp_path / 'run').mkdir()
  with open(tmp_path / 'run' / run_dir.LOCK_FILE, 'w') as holder:
    fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
    holder.write('4242\n')
    holder.flush()
    res = train(tmp_path, 'run', 'fedavg', 'inprocess')
  one_error_line(res, 'is in use by another run (pid 4242)')
  assert sorted(os.listdir(tmp_path / 'run')) == [run_dir.LOCK_FILE]


def test_the_binary_refuses_lost_checkpoints_in_one_line(runs, tmp_path):
  out = damaged_copy(runs, 'fedavg', tmp_path)
  shutil.rmtree(out / 'checkpoints')
  os.remove(out / 'run_identity.json')  # the library run had no flags
  before = (out / 'metrics.csv').read_bytes()
  res = train(tmp_path, 'run', 'fedavg', 'inprocess')
  one_error_line(res, 'checkpoints is missing')
  assert (out / 'metrics.csv').read_bytes() == before


@pytest.mark.slow
def test_two_runs_at_once_one_refused_the_other_exact(references, tmp_path):
  first = train(tmp_path, 'run', 'feddyn', 'inprocess', wait=False)
  deadline = time.monotonic() + 600
  while not (tmp_path / 'run' / 'metrics.csv').exists():
    assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
    time.sleep(0.2)
  first.send_signal(signal.SIGSTOP)  # held mid-run while the second one starts
  try:
    second = train(tmp_path, 'run', 'feddyn', 'inprocess')
  finally:
    first.send_signal(signal.SIGCONT)
  one_error_line(second, f'is in use by another run (pid {first.pid})')
  _, err = first.communicate(timeout=600)
  assert first.returncode == 0, err[-3000:]
  assert_same_as(references('feddyn', 'inprocess'), tmp_path / 'run', 'feddyn')


@pytest.mark.slow
def test_the_binary_reruns_a_finished_run_whose_metrics_csv_was_deleted(
    references, tmp_path):
  reference = references('fedavg', 'inprocess')
  shutil.copytree(reference, tmp_path / 'run')
  os.remove(tmp_path / 'run' / 'metrics.csv')
  res = train(tmp_path, 'run', 'fedavg', 'inprocess')
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'metrics.csv is missing or empty, so no table or figure' in res.stderr
  assert 'final eval: ' in res.stdout and 'loss=' in res.stdout
  assert summary(tmp_path / 'run') == summary(reference)
