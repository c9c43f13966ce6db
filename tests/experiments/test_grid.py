"""The grid driver: parsing, scoring, and one small end-to-end grid."""

import csv
import os
import subprocess
import sys

import pytest

from paths import ROOT



def test_seed_major_keeps_each_seeds_order():
  from tff_algos import training
  seeds = [3, 1, 3, 2, 1, 3]
  assert training.seed_major(seeds, lambda s: s) == [0, 2, 5, 1, 4, 3]
  assert training.seed_major([], lambda s: s) == []


def test_parse_grid_and_score():
  from experiments import grid
  axes = grid.parse_grid('client_learning_rate=1, 0.1; local_steps=10')
  assert axes == [('client_learning_rate', ['1', '0.1']), ('local_steps', ['10'])]
  for bad in ('', 'nope=1', 'local_steps', 'local_steps='):
    with pytest.raises(ValueError):
      grid.parse_grid(bad)
  rows = [{'round': r, 'eval/acc': r / 10} for r in (2, 4, 6, 8)] + [{'round': 9.0}]
  assert grid.score(rows, 'eval/acc', 5) == pytest.approx((0.6 + 0.8) / 2)
  assert grid.score(rows, 'eval/acc', 100) == pytest.approx(0.5)


def test_combinations_are_values_and_leave_the_flags_alone():
  from absl import flags
  from experiments.lib import flags as trainer_flags
  from experiments import grid
  FLAGS = flags.FLAGS
  FLAGS.unparse_flags()
  try:
    FLAGS(['grid', '--algorithm=fedgbo', '--local_steps=4'])
    base = trainer_flags.TrainerArgs.from_flags()
    axes = grid.parse_grid('algorithm=fedgbo,fedavg;client_learning_rate=0.5,0.25')
    runs = grid.combinations(base, axes)
    assert [c for c, _ in runs] == [
        {'algorithm': a, 'client_learning_rate': lr}
        for a in ('fedgbo', 'fedavg') for lr in ('0.5', '0.25')]
    hps = [trainer_flags.hparams(args=args) for _, args in runs]
    assert [hp.client_learning_rate for hp in hps] == [0.5, 0.25, 0.5, 0.25]
    # FedGBO's own default (client sgdm) applies to its runs only.
    assert [hp.client_optimizer for hp in hps] == ['sgdm', 'sgdm', 'sgd', 'sgd']
    assert all(hp.local_steps == 4 for hp in hps)
    assert (FLAGS.algorithm, FLAGS.client_learning_rate) == ('fedgbo', 0.1)
    assert not FLAGS['client_learning_rate'].present
    with pytest.raises(ValueError, match='client_learning_rate=x'):
      grid.combinations(base, grid.parse_grid('client_learning_rate=x'))
    with pytest.raises(ValueError, match='a grid axis is a trainer flag'):
      grid.parse_grid('grid_name=a,b')
  finally:
    FLAGS.unparse_flags()


def test_small_grid_runs_every_combination(tmp_path):
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.grid', '--model=logistic', '--total_rounds=3',
       '--rounds_per_eval=1', '--clients_per_round=3', '--local_steps=2',
       "--grid=client_learning_rate=0.5,0.0", '--group_by=client_learning_rate',
       '--select_last_rounds=2', f'--root_output_dir={tmp_path}', '--noprogress'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  with open(tmp_path / 'grid_digits' / 'grid.csv') as f:
    rows = list(csv.DictReader(f))
  assert [r['client_learning_rate'] for r in rows] == ['0.5', '0.0']  # sorted by score
  assert float(rows[0]['score']) > float(rows[1]['score'])  # lr 0 cannot learn
  assert res.stderr.count('warning: --client_learning_rate=0: fedavg clients do not move') == 1
  assert 'best per client_learning_rate' in res.stdout


_TINY = ['--model=logistic', '--total_rounds=2', '--rounds_per_eval=1',
         '--clients_per_round=3', '--local_steps=2', '--noprogress']


def _run(module, *argv):
  res = subprocess.run([sys.executable, '-m', module, *_TINY, *argv], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=1200)
  assert res.returncode == 0, res.stderr[-3000:]
  return res


@pytest.mark.slow
@pytest.mark.timeout(2400)  # five start-ups of TensorFlow
def test_a_grid_in_one_process_trains_the_models_of_separate_trainer_runs(tmp_path):
  """All combinations run in one process, each from its own values (no flag
  rewritten between runs), give the models of one trainer process per run:
  FedAvg's two learning rates on one shared build, then SCAFFOLD (client
  state, a build per learning rate) in the grid's process."""
  import numpy as np
  res = _run('experiments.grid', '--grid=algorithm=fedavg,scaffold;client_learning_rate=0.5,0.1',
             '--grid_name=g', f'--root_output_dir={tmp_path}')
  progress = [line for line in res.stdout.splitlines() if line.startswith('[')]
  assert [line.split()[0] for line in progress] == ['[1/4]', '[2/4]', '[3/4]', '[4/4]']
  assert ["earlier run's build" in line for line in progress] == [False, True, False, False]
  for algorithm in ('fedavg', 'scaffold'):
    for lr in ('0.5', '0.1'):
      name = f'alone_{algorithm}_{lr}'
      _run('experiments.train', f'--algorithm={algorithm}', f'--client_learning_rate={lr}',
           f'--root_output_dir={tmp_path}', f'--experiment_name={name}')
      grid = np.load(tmp_path / 'g' / f'algorithm={algorithm}_client_learning_rate={lr}' /
                     'final_weights.npz')
      alone = np.load(tmp_path / name / 'final_weights.npz')
      assert grid.files == alone.files
      for k in grid.files:
        np.testing.assert_allclose(grid[k], alone[k], rtol=0, atol=1e-6)


_SHOUTING_WORKERS = """
import time
from experiments.lib import runtime_flags

def shout(item):  # a run's output: many lines, not flushed one by one, for ~2 s
  for j in range(300):
    print(f'item {item} line {j:03d} ' + 'x' * 80)
    time.sleep(0.007)  # so that the two workers' items overlap
  print(f'[{item + 1}/4] done', flush=True)  # as a grid's progress line
  return item

if __name__ == '__main__':
  options = dict(backend='inprocess', workers=None, concurrent_clients=None)
  print(sorted(runtime_flags.map_in_processes(shout, range(4), 2, options)), flush=True)
"""


@pytest.mark.slow  # --jobs itself: test_a_grid_in_worker_processes_trains_the_models_...
def test_worker_processes_write_whole_lines(tmp_path):
  """Workers share the parent's stdout (a pipe here): each line reaches it
  whole, never split by another worker's (a CI run once lost a grid's
  `[i/n]` line inside another worker's block-buffered output)."""
  script = tmp_path / 'shout.py'
  script.write_text(_SHOUTING_WORKERS)
  # Unbuffered, as where the line was lost: a print's text and newline apart.
  res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED='1'),
                       timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  lines = res.stdout.splitlines()
  expected = {f'item {i} line {j:03d} ' + 'x' * 80 for i in range(4) for j in range(300)}
  expected |= {f'[{i}/4] done' for i in range(1, 5)} | {'[0, 1, 2, 3]'}
  assert sorted(lines) == sorted(expected)


_DYING_WORKER = """
import os, signal, sys, time
from experiments.lib import runtime_flags
from tff_algos.errors import UserError

from tasks import MissingData

def work(item):
  if item == 1 and sys.argv[1] == 'kill':
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a worker
  if item == 1 and sys.argv[1] == 'missing':  # a UserError that does not unpickle as it is
    raise MissingData('the data file x is missing', 'download it')
  time.sleep(0.5)
  return item

def killing_submit(self, *args, **kwargs):  # a worker dies while the items are submitted
  future = super(type(self), self).submit(*args, **kwargs)
  if len(self._processes) == 2 and not getattr(self, 'killed', False):
    self.killed = True
    os.kill(next(iter(self._processes)), signal.SIGKILL)
    time.sleep(2)  # until the executor has seen it
  return future

if __name__ == '__main__':
  options = dict(backend='inprocess' if sys.argv[1] != 'bad_backend' else 'nope',
                 workers=None, concurrent_clients=None)
  if sys.argv[1] == 'kill_at_submit':
    import concurrent.futures
    concurrent.futures.ProcessPoolExecutor = type(
        'Killing', (concurrent.futures.ProcessPoolExecutor,), dict(submit=killing_submit))
  done = []
  try:
    for result in runtime_flags.map_in_processes(work, range(6), 2, options):
      done.append(result)
  except UserError as e:
    print('error:', e, flush=True)
    sys.exit(2)
"""


def _run_script(tmp_path, source: str, *args) -> tuple[int, str, str]:
  """(exit status, stdout, stderr) of the script `source` run with `args`; any
  process it leaves behind (a worker of the map) is killed."""
  import psutil
  script = tmp_path / 'script.py'
  script.write_text(source)
  proc = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    out, err = proc.communicate(timeout=240)
  finally:
    children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    proc.kill()
    psutil.wait_procs(children, timeout=10)
  return proc.returncode, out, err


@pytest.mark.parametrize('how,said', [
    ('kill', 'error: a worker process died (killed by SIGKILL, often the out-of-memory '
             'killer) before the 6 items'),
    ('missing', 'error: the data file x is missing; download it'),
    ('bad_backend', 'error: a worker process stopped before the 6 items'),
    ('kill_at_submit', 'error: a worker process died (killed by SIGKILL, often the '
                       'out-of-memory killer) before the 6 items'),
])
def test_a_worker_process_that_dies_is_one_error_not_a_hang(tmp_path, how, said):
  """A worker killed mid-item (e.g. by the out-of-memory killer) ends the map
  with one line naming the signal and the fix; a multiprocessing.Pool waited
  forever for the item it held (a CI run once hung so). A worker's user
  error reaches the parent as its own line (MissingData does not unpickle as
  it is: it broke the pool); a worker whose start fails is said as such."""
  returncode, out, err = _run_script(tmp_path, _DYING_WORKER, how)
  assert returncode == 2, (out, err[-3000:])
  assert out.startswith(said), (out, err[-3000:])
  if how.startswith('kill'):
    assert 'fewer --jobs' in out and 'Traceback' not in err, (out, err[-3000:])


@pytest.mark.timeout(1200)
def test_a_grid_in_worker_processes_trains_the_models_of_one_process(tmp_path):
  """--jobs=2: the combinations train in two spawned processes, with the same
  models, scores and summaries (flags and backend included) as in one, where
  a seed's runs go in a row (`training.seed_major`)."""
  import json
  import numpy as np
  grid = '--grid=client_learning_rate=0.5,0.1;local_steps=1,2;seed=0,1'
  res = _run('experiments.grid', grid, '--grid_name=one', f'--root_output_dir={tmp_path}')
  assert [l.split()[0] for l in res.stdout.splitlines() if l.startswith('[')] == [
      f'[{i}/8]' for i in (1, 3, 5, 7, 2, 4, 6, 8)]  # seed 0's four, then seed 1's
  res = _run('experiments.grid', grid, '--grid_name=two', '--jobs=2',
             f'--root_output_dir={tmp_path}')
  # (One CI run once lacked one worker's progress line: the output, if again.)
  assert sorted(l.split()[0] for l in res.stdout.splitlines() if l.startswith('[')) == [
      f'[{i}/8]' for i in range(1, 9)], (res.stdout, res.stderr[-3000:])
  runs = sorted(p.name for p in (tmp_path / 'one').iterdir() if p.is_dir())
  assert len(runs) == 8 and runs == sorted(p.name for p in (tmp_path / 'two').iterdir()
                                           if p.is_dir())
  for run in runs:
    one = np.load(tmp_path / 'one' / run / 'final_weights.npz')
    two = np.load(tmp_path / 'two' / run / 'final_weights.npz')
    for k in one.files:
      np.testing.assert_allclose(two[k], one[k], rtol=0, atol=1e-6)
    summaries = [json.loads((tmp_path / g / run / 'summary.json').read_text())
                 for g in ('one', 'two')]
    assert summaries[0]['flags'] == summaries[1]['flags']
    assert summaries[0]['grid'] == summaries[1]['grid']
  tables = [list(csv.DictReader(open(tmp_path / g / 'grid.csv'))) for g in ('one', 'two')]
  assert tables[0] == tables[1]


def test_ctrl_c_on_a_grid_in_worker_processes_is_one_line(tmp_path):
  """Ctrl-C (SIGINT to the terminal's process group) on `--jobs=2`: the parent
  prints its one stop line and exits 130; the pool's workers neither print
  'Process SpawnProcess-N:' tracebacks nor outlive it."""
  import signal
  import time
  import psutil
  grid = '--grid=client_learning_rate=0.5,0.1;seed=0,1'
  proc = subprocess.Popen(
      [sys.executable, '-m', 'experiments.grid', *_TINY, '--total_rounds=100000', grid,
       '--jobs=2', f'--root_output_dir={tmp_path}'], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, start_new_session=True)
  deadline = time.monotonic() + 600
  while len(workers := psutil.Process(proc.pid).children(recursive=True)) < 2:
    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
    time.sleep(0.2)
  # While they start (importing TensorFlow: where a worker's traceback came).
  time.sleep(2)
  os.killpg(proc.pid, signal.SIGINT)
  try:
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 130, err[-3000:]
  assert 'Traceback' not in err and 'Spawn' not in err, err[-3000:]
  assert psutil.wait_procs(workers, timeout=60)[1] == []  # none left alive


_INTERRUPTED_SPAWN = """
import concurrent.futures, os, signal, sys, time
from experiments.lib import runtime_flags

submit = concurrent.futures.ProcessPoolExecutor.submit

def interrupting_submit(self, *args, **kwargs):  # Ctrl-C while the workers are spawned
  future = submit(self, *args, **kwargs)
  if not getattr(self, 'interrupted', False):
    self.interrupted = True
    os.kill(os.getpid(), signal.SIGINT)
  return future

def work(item):
  time.sleep(0.5)
  return item

if __name__ == '__main__':
  concurrent.futures.ProcessPoolExecutor.submit = interrupting_submit
  options = dict(backend='inprocess', workers=None, concurrent_clients=None)
  done = []
  try:
    for result in runtime_flags.map_in_processes(work, range(6), 2, options):
      done.append(result)
  except KeyboardInterrupt:
    print('interrupted after', len(done), flush=True)
    sys.exit(130)
  print('finished', sorted(done), flush=True)
"""


def test_ctrl_c_while_the_workers_are_spawned_stops_the_map(tmp_path):
  """A Ctrl-C that comes while `map_in_processes` spawns its workers (SIGINT
  is held from them then) stops the map at once, workers included, instead
  of being lost (it was ignored there, and every item ran)."""
  returncode, out, err = _run_script(tmp_path, _INTERRUPTED_SPAWN)
  assert (returncode, out) == (130, 'interrupted after 0\n'), (out, err[-3000:])
  assert 'Traceback' not in err and 'Spawn' not in err, err[-3000:]


def test_a_workers_missing_data_error_comes_back_whole():
  """What a --jobs worker sends back: MissingData with its parts (its args
  alone did not rebuild it), and an exception that cannot be pickled as a
  RuntimeError carrying its traceback, a user error as a plain one."""
  import pickle
  from experiments.lib import runtime_flags
  from tasks import MissingData
  from tff_algos.errors import UserError
  e = pickle.loads(pickle.dumps(MissingData('x is missing', 'get it', 'or not')))
  assert type(e) is MissingData and (e.missing, e.get_it, e.offline) == (
      'x is missing', 'get it', 'or not') and str(e) == 'x is missing; get it; or not'

  class Unpicklable(UserError):
    def __init__(self, a, b):
      super().__init__(f'{a} {b}')

  def raise_(error):
    raise error
  with pytest.raises(UserError, match='^one two$') as caught:
    runtime_flags._call_in_worker(raise_, Unpicklable('one', 'two'))
  assert type(caught.value) is UserError
  with pytest.raises(RuntimeError, match='(?s)Traceback.*ValueError: <function'):
    runtime_flags._call_in_worker(raise_, ValueError(lambda: 0))
