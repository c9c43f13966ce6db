"""A disk that fills up at each of a run's write points: one `error:` line
naming the file and the round a rerun resumes from, exit status 2, no
traceback; once space is freed, the same command resumes to exactly the
model of an uninterrupted run.

The disk fills through `full_disk.FullDisk` (ENOSPC injected at `open`,
`os.pwrite` and TensorFlow's record writer), so these run anywhere; one slow
case fills a real tmpfs (skipped where it cannot be mounted).
"""

import os
import re
import subprocess
import sys

import pytest

from full_disk import FullDisk
from paths import ROOT
from reference_runs import reference_runs  # noqa: F401  (a fixture)
import test_faults as faults
from tff_algos.errors import UserError

NO_SPACE = (r'^no space left on device writing (?P<path>\S+); free space and rerun the '
            r'same command(?: to (?:resume from round (?P<round>\d+)|start it again))?$')

# (algorithm, the file whose write fills the disk, which write to it); the
# default suite fills it at the start, in the rows, in a checkpoint and in the
# client store, -m slow at every other write point.
_SLOW = pytest.mark.slow
WRITE_POINTS = [
    ('fedavg', None, 1),                    # full from the start
    pytest.param('fedavg', 'run_identity.json', 1, marks=_SLOW),
    ('fedavg', 'metrics.csv', 3),           # mid-run: the header grows at round 4
    pytest.param('fedavg', 'events.out.tfevents', 3, marks=_SLOW),  # TensorBoard
    ('fedavg', 'state.npz', 2),             # the second checkpoint
    pytest.param('fedavg', 'run.json', 3, marks=_SLOW),
    pytest.param('fedavg', 'checkpoints.json', 2, marks=_SLOW),  # the manifest
    pytest.param('fedavg', 'summary.json', 1, marks=_SLOW),  # after the last checkpoint
    pytest.param('fedavg', 'final_weights.npz', 1, marks=_SLOW),
    ('feddyn', 'rows.f32', 8),              # the store's rows, round 2
    pytest.param('feddyn', 'undo_', 2, marks=_SLOW),  # its undo log
    pytest.param('feddyn', 'sums_', 3, marks=_SLOW),  # its checkpoint
]


@pytest.fixture(scope='module')
def ref(reference_runs):
  return reference_runs


def no_space(message):
  match = re.match(NO_SPACE, message)
  assert match, message
  return match


@pytest.mark.parametrize('name,target,nth', WRITE_POINTS)
def test_a_full_disk_is_one_line_and_the_rerun_is_exact(ref, tmp_path, name, target, nth):
  runs, algorithms, task = ref
  out = tmp_path / 'run'
  disk = FullDisk(tmp_path, target, nth).install()
  try:
    with pytest.raises(UserError) as error:
      faults.resume(algorithms, task, name, out)
  finally:
    disk.uninstall()
  said = no_space(str(error.value))
  if target is not None:
    assert target in said['path'], said['path']
  assert not list(tmp_path.rglob('*.tmp')) and not list(tmp_path.rglob('*_temp*'))
  result = faults.resume(algorithms, task, name, out)  # space freed
  if said['round'] is not None:
    assert result.resumed_from == int(said['round'])
  faults.assert_same_model(runs, name, out, result)


def test_a_full_disk_while_report_draws_curves_is_one_line(ref, tmp_path):
  import shutil
  from experiments import report
  out = tmp_path / 'run'
  shutil.copytree(ref[0]['fedavg'][0], out)
  disk = FullDisk(tmp_path, 'curves.png').install()
  try:
    with pytest.raises(UserError, match=r'no space left on device writing \S+curves.png'):
      report.print_runs([str(out)])
  finally:
    disk.uninstall()


def train_filling(tmp_path, target, nth, **kwargs):
  """`experiments.train` (FedDyn, C++ backend: the library reference's) whose
  disk fills at the `nth` write to `target`."""
  env = dict(os.environ, PYTHONPATH=f'{ROOT}:{os.path.join(ROOT, "tests", "training")}')
  cmd = [sys.executable, os.path.join(ROOT, 'tests', 'training', 'full_disk.py'),
         str(tmp_path), target, str(nth), '--', '--task=digits', '--model=logistic',
         '--num_clients=10', '--clients_per_round=5', '--client_batch_size=16',
         '--local_steps=3', '--rounds_per_eval=3', '--rounds_per_checkpoint=2',
         f'--total_rounds={faults.ROUNDS}', '--noprogress', '--algorithm=feddyn',
         '--backend=cpp', f'--root_output_dir={tmp_path}', '--experiment_name=run',
         '--feddyn_alpha=0.1']
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=900, **kwargs)


def test_the_binary_says_a_full_disk_in_one_line_and_resumes_exactly(ref, tmp_path):
  res = train_filling(tmp_path, 'rows.f32', 12)
  faults.one_error_line(res, 'no space left on device writing ')
  line = [l for l in res.stderr.splitlines() if l.startswith('error:')][0]
  said = no_space(line[len('error: '):])
  assert said['path'].endswith('client_state/rows.f32') and said['round'] == '2', line
  resumed = faults.train(tmp_path, 'run', 'feddyn', 'cpp')
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'resuming from round 2' in resumed.stdout
  faults.assert_same_as(ref[0]['feddyn'][0], tmp_path / 'run', 'feddyn')


@pytest.mark.slow
def test_a_real_full_tmpfs_is_one_line_and_the_rerun_is_exact(ref, tmp_path):
  mount = tmp_path / 'disk'
  mount.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=600k', 'tmpfs', str(mount)],
                    capture_output=True).returncode != 0:
    pytest.skip('cannot mount a tmpfs here')
  try:
    res = faults.train(mount, 'run', 'feddyn', 'cpp')
    faults.one_error_line(res, 'no space left on device writing ')
    subprocess.run(['mount', '-o', 'remount,size=64m', str(mount)], check=True)
    resumed = faults.train(mount, 'run', 'feddyn', 'cpp')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    faults.assert_same_as(ref[0]['feddyn'][0], mount / 'run', 'feddyn')
  finally:
    subprocess.run(['umount', str(mount)], check=False)


def test_a_full_disk_in_an_npz_write_leaves_nothing_to_complain_when_collected(
    tmp_path, monkeypatch):
  """np.savez's own ZipFile, left open by a failed write, printed "Exception
  ignored in: ZipFile.__del__" and a traceback when it was collected."""
  import gc
  import numpy as np
  from tff_algos.training import outputs
  complaints = []
  monkeypatch.setattr(sys, 'unraisablehook', complaints.append)
  disk = FullDisk(tmp_path, 'state.npz').install()
  try:
    with pytest.raises(OSError, match='No space left'):
      outputs.write_npz(str(tmp_path / 'state.npz'), [np.zeros(1000), np.ones(3)])
  finally:
    disk.uninstall()
  gc.collect()
  assert complaints == []
  outputs.write_npz(str(tmp_path / 'state.npz'), [np.zeros(1000), np.ones(3)])
  with np.load(tmp_path / 'state.npz') as saved:  # what np.load reads back
    assert [a.tolist() for a in saved.values()] == [[0.0] * 1000, [1.0] * 3]
