"""Hostile artefacts: a run directory whose files were deleted, cut short,
filled with other bytes or overwritten at random ends, for the trainer and
for `experiments.report`, in an exact resume, a rollback or rebuild with a
`note:`, or one `error:` line -- never in a traceback or a wrong result.

The trainer runs in-process on copies of `reference_runs` (tests/training/
conftest.py): a FedDyn run (its disk store included) that died in round 5
with checkpoints at rounds 2 and 4, and finished runs for `report`.
"""

import json
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from paths import ROOT
from reference_runs import reference_runs  # noqa: F401  (a fixture)
import test_faults as faults
from tff_algos.errors import UserError
from tff_algos.training import outputs as run_outputs, run_dir, summary_file

NAME = 'feddyn'


@pytest.fixture(scope='module')
def ref(reference_runs):
  return reference_runs


def copy_of(ref, tmp_path, which='died', name=NAME):
  runs, _, _ = ref
  full, _, died = runs[name]
  out = tmp_path / 'run'
  shutil.copytree(died if which == 'died' else full, out)
  return out


def resume(ref, out, name=NAME):
  _, algorithms, task = ref
  return faults.resume(algorithms, task, name, out)


def notes(capsys):
  return [l for l in capsys.readouterr().err.splitlines() if l.startswith('note:')]


# -- 1. checkpoints.json deleted and metrics.csv rows lost ----------------------
def test_lost_rows_without_the_manifest_keep_the_totals(ref, tmp_path, capsys):
  """The checkpoint keeps its own totals (run.json): deleting checkpoints.json,
  as its refusal advises, cannot make the totals count only the rows left."""
  out = copy_of(ref, tmp_path)
  os.remove(out / run_dir.MANIFEST_FILE)
  lines = (out / 'metrics.csv').read_text().splitlines(keepends=True)
  (out / 'metrics.csv').write_text(''.join(lines[:3]))  # header, rounds 1 and 2
  result = resume(ref, out)
  assert result.resumed_from == 4
  said = notes(capsys)
  assert len(said) == 1 and 'lacks 2 of rounds 1-4' in said[0], said
  faults.assert_same_model(ref[0], NAME, out, result)  # cum_* and summary totals


def test_lost_rows_and_no_totals_anywhere_are_refused(ref, tmp_path):
  """A checkpoint from before checkpoints kept totals, without its manifest,
  and rows lost: the totals cannot be rebuilt, so the resume is refused."""
  out = copy_of(ref, tmp_path)
  os.remove(out / run_dir.MANIFEST_FILE)
  for entry in (out / 'checkpoints').glob(f'*/{run_outputs.RUN_FILE}'):
    os.remove(entry)
  lines = (out / 'metrics.csv').read_text().splitlines(keepends=True)
  (out / 'metrics.csv').write_text(''.join(lines[:3]))
  before = (out / 'metrics.csv').read_bytes()
  with pytest.raises(UserError, match=r"metrics.csv lacks rows of rounds 1-4 .*keeps no "
                     r"totals.*cannot be rebuilt; restore it .*--restart"):
    resume(ref, out)
  assert (out / 'metrics.csv').read_bytes() == before


def test_changed_metrics_rows_are_refused(ref, tmp_path):
  out = copy_of(ref, tmp_path)
  path = out / 'metrics.csv'
  text = path.read_text()
  row2 = text.splitlines()[2]
  cells = row2.split(',')
  cells[2] = cells[2].replace(cells[2][-1], '7' if cells[2][-1] != '7' else '3')
  path.write_text(text.replace(row2, ','.join(cells)))
  with pytest.raises(UserError, match=r'metrics.csv: rows 1-4 do not match the checkpoint '
                     r'of round 4 \(changed outside the run\)'):
    resume(ref, out)


# -- 3. damaged text artefacts -------------------------------------------------
def test_a_non_utf8_metrics_csv_is_refused_by_the_trainer_and_report(ref, tmp_path):
  out = copy_of(ref, tmp_path)
  path = out / 'metrics.csv'
  data = bytearray(path.read_bytes())
  second = data.index(b'\n') + 1
  data[second + 1:second + 3] = b'\xff\xfe'  # in line 2
  path.write_bytes(bytes(data))
  with pytest.raises(UserError, match=r'metrics.csv, line 2: not a metrics row \(not '
                     r'UTF-8 text'):
    resume(ref, out)
  from experiments import report
  with pytest.raises(UserError, match=r'metrics.csv, line 2: .*not UTF-8'):
    report.print_runs([str(out)])


@pytest.mark.parametrize('line', ['abc,def', 'garbage'])
def test_report_refuses_a_garbage_metrics_line_as_the_trainer_does(ref, tmp_path, line):
  out = copy_of(ref, tmp_path, which='full')
  path = out / 'metrics.csv'
  lines = path.read_text().splitlines(keepends=True)
  lines[3] = line + '\n'
  path.write_text(''.join(lines))
  from experiments import report
  with pytest.raises(UserError, match=r'metrics.csv, line 4: not a metrics row'):
    report.print_runs([str(out)])
  with pytest.raises(UserError, match=r'metrics.csv, line 4: not a metrics row'):
    resume(ref, out)


def report_binary(out):
  return subprocess.run([sys.executable, '-m', 'experiments.report', f'--run_dirs={out}'],
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize('damage,text', [
    ('summary', 'summary.json is unreadable (JSONDecodeError); rerun'),
    ('utf8', 'metrics.csv, line 2: not a metrics row (not UTF-8 text')])
def test_the_report_binary_says_damage_in_one_line(ref, tmp_path, damage, text):
  out = copy_of(ref, tmp_path, which='full')
  if damage == 'summary':
    (out / 'summary.json').write_text('{bad')
  else:
    (out / 'metrics.csv').write_bytes(
        (out / 'metrics.csv').read_bytes().replace(b'\n', b'\n\xff', 1))
  faults.one_error_line(report_binary(out), text)


def test_a_changed_digit_in_summary_json_is_refused_not_reported(ref, tmp_path):
  """Parseable but changed: its checksum says so (a report would have shown the
  changed accuracy as the run's); the run's command rebuilds it exactly."""
  from experiments import report
  out = copy_of(ref, tmp_path, which='full')
  text = (out / 'summary.json').read_text()
  assert report.read_final_eval(str(out / 'summary.json'))  # sound as written
  final = summary_file.read(str(out / 'summary.json'))['final_eval']
  key = next(k for k, v in final.items() if isinstance(v, float))
  digits = repr(final[key])
  changed = digits[:-1] + ('1' if digits[-1] != '1' else '2')
  assert text.count(digits) >= 1
  (out / 'summary.json').write_text(text.replace(digits, changed))
  with pytest.raises(UserError, match=r'summary.json is unreadable \(checksum mismatch\); '
                                      'rerun'):
    report.read_final_eval(str(out / 'summary.json'))
  faults.one_error_line(report_binary(out), 'summary.json is unreadable (checksum mismatch)')
  legacy = json.loads(text)
  del legacy['crc']  # a summary written before it had one is taken as it is
  (out / 'summary.json').write_text(json.dumps(legacy))
  assert summary_file.read(str(out / 'summary.json')) == legacy


# -- 4. random bytes in every artefact a run reads ------------------------------
# (artefact, which run): the files a resume reads (of the latest checkpoint,
# and the store's), and summary.json, which a finished run's rerun rebuilds.
ARTEFACTS = [('metrics.csv', 'died'), ('checkpoints.json', 'died'),
             ('checkpoints/round_4/state.npz', 'died'),
             (f'checkpoints/round_4/{run_outputs.RUN_FILE}', 'died'),
             ('run_identity.json', 'died'), ('client_state/rows.f32', 'died'),
             ('client_state/mask_4.npy', 'died'), ('client_state/sums_4.npy', 'died'),
             ('client_state/undo_4.log', 'died'), ('summary.json', 'full')]
# The default suite's subset: one overwrite and one truncation of each.
CHEAP = [(a, w, 'overwrite', 0) for a, w in ARTEFACTS] + [
    (a, w, 'truncate', 0) for a, w in ARTEFACTS]
MATRIX = [pytest.param(a, w, d, s, marks=pytest.mark.slow) for a, w in ARTEFACTS
          for d in ('overwrite', 'truncate') for s in (1, 2, 3)]


def corrupt(path, damage, seed):
  """Overwrites 1-8 random bytes at random positions, or cuts the file short."""
  rng = np.random.default_rng([seed, zlib.crc32(str(path.name).encode())])
  data = bytearray(path.read_bytes())
  if damage == 'truncate':
    path.write_bytes(bytes(data[:int(rng.integers(0, len(data)))]))
    return
  for pos in rng.integers(0, len(data), size=int(rng.integers(1, 9))):
    data[pos] = int(rng.integers(0, 256))
  path.write_bytes(bytes(data))


def assert_exact_or_refused_rows_only(ref, out):
  """The resumed run equals the uninterrupted one; a client row that differs
  was not read since (it fails its checksum, so a later read refuses it)."""
  full, _, _ = ref[0][NAME]
  saved, expected = np.load(out / 'final_weights.npz'), np.load(full / 'final_weights.npz')
  for key in expected.files:
    np.testing.assert_array_equal(saved[key], expected[key])
  ref_rows = {r['round']: r for r in faults.metrics(full)}
  for row in faults.metrics(out):
    assert row == ref_rows[row['round']]
  assert faults.summary(out) == faults.summary(full)
  faults.assert_tensorboard_has_every_row_once(out, full)
  rows, ref_store = (np.fromfile(p / 'client_state' / 'rows.f32', np.uint8) for p in (out, full))
  sums = np.load(out / 'client_state' / f'sums_{faults.ROUNDS}.npy')
  row_bytes = len(rows) // len(sums)
  for i in range(len(sums)):
    got = rows[i * row_bytes:(i + 1) * row_bytes]
    if not np.array_equal(got, ref_store[i * row_bytes:(i + 1) * row_bytes]):
      assert zlib.crc32(got.tobytes()) != sums[i], f'client row {i} changed unnoticed'


def check_outcome(ref, out, capsys):
  """Runs the trainer on `out`: an exact resume (notes allowed) or one line."""
  try:
    result = resume(ref, out)
  except UserError as e:
    assert '\n' not in str(e) and ('--restart' in str(e) or 'restore' in str(e)
                                   or 'delete' in str(e)), str(e)
    return 'refused'
  said = notes(capsys)
  assert_exact_or_refused_rows_only(ref, out)
  return f'resumed from {result.resumed_from}' + (' with a note' if said else '')


def check_report(ref, out, capsys, damage):
  """`report` on a finished run's damaged copy: its reference's output (cut
  short: the rows that survive), or a refusal."""
  from experiments import report
  full = ref[0][NAME][0]
  report.print_runs([str(full)])
  expected = capsys.readouterr().out.replace(str(full), str(out))
  try:
    report.print_runs([str(out)])
  except UserError as e:
    assert '\n' not in str(e)
    return
  got = capsys.readouterr().out
  assert got == expected or damage == 'truncate', got


@pytest.mark.parametrize('artefact,which,damage,seed', CHEAP + MATRIX)
def test_random_bytes_in_an_artefact(ref, tmp_path, capsys, artefact, which, damage,
                                     seed):
  out = copy_of(ref, tmp_path, which)
  corrupt(out / artefact, damage, seed)
  if artefact in ('metrics.csv', 'summary.json', 'checkpoints.json'):
    shown = tmp_path / 'shown'
    shutil.copytree(copy_of(ref, tmp_path / 'f', 'full'), shown)
    corrupt(shown / artefact, damage, seed)
    check_report(ref, shown, capsys, damage)
  outcome = check_outcome(ref, out, capsys)
  print(artefact, damage, seed, '->', outcome)
