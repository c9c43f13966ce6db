"""Client-state store at FEMNIST scale: a few FedDyn rounds in bounded memory.

    python -m experiments.client_state_benchmark --model=cnn_dropout   # 3,400 clients, 15 GB on disk
    python -m experiments.client_state_benchmark --num_clients=340 --rounds=3

Workload: the FEMNIST CNN of papers 000/004 (`tasks.models.femnist_cnn`,
870,334 parameters: 3,400 clients x 3.5 MB = 11 GB of client state) or TFF's
EMNIST `cnn_dropout` (`--model=cnn_dropout`, 1,206,590 parameters: 15.3 GB) on
synthetic data of EMNIST's shape; FedDyn (or SCAFFOLD)
keeps one model-sized state per client in a `training.client_state.ClientStateStore`
on disk. With `--fill` every client's row is written first (the worst case:
every client has participated), then `--rounds` rounds run gather -> TFF round
-> scatter -> checkpoint. A further round is then run past the last
checkpoint and the store is reopened and restored, which must give back the
checkpoint's rows exactly (`resume_check: exact`).

Peak resident memory is sampled (psutil, every 50 ms) for this process and
its TFF worker_binary children; `ru_maxrss` of this process is reported too.
The store's files are deleted at the end (unless --keep). Output: one
`name: value` line per measurement.
"""

from __future__ import annotations

import collections
import os
import resource
import shutil
import threading
import time

from absl import flags
import numpy as np

from experiments.lib import common

flags.DEFINE_integer('num_clients', 3400, 'Clients in the population (FEMNIST: 3,400).')
flags.DEFINE_integer('clients_per_round', 10, 'Cohort size M.')
flags.DEFINE_integer('rounds', 3, 'Rounds to run after the fill.')
flags.DEFINE_integer('local_steps', 5, 'Local steps K per client.')
flags.DEFINE_integer('batch_size', 20, 'Client batch size.')
flags.DEFINE_integer('examples_per_client', 40, 'Synthetic examples per client.')
flags.DEFINE_enum('algorithm', 'feddyn', ['feddyn', 'scaffold'], 'Stateful algorithm.')
flags.DEFINE_enum('model', 'femnist_cnn', ['femnist_cnn', 'cnn_dropout'],
                  "femnist_cnn (papers 000/004, 870,334 parameters) or TFF's EMNIST "
                  'cnn_dropout (1,206,590 parameters).')
flags.DEFINE_bool('fill', True, 'Write every client row before the rounds.')
flags.DEFINE_string('store_dir', '/tmp/client_state_benchmark', 'Where the store lives.')
flags.DEFINE_bool('keep', False, 'Keep the store files (default: delete them).')
FLAGS = flags.FLAGS

GB = 1024 ** 3


class PeakRSS:
  """Samples RSS of this process and of its worker_binary children."""

  def __init__(self, interval_s: float = 0.05):
    import psutil
    self._psutil = psutil
    self._me = psutil.Process()
    self.peak_self = self.peak_workers = self.peak_total = 0
    self._stop = threading.Event()
    self._interval = interval_s
    self._thread = threading.Thread(target=self._run, daemon=True)

  def sample(self):
    mine = self._me.memory_info().rss
    workers = 0
    for child in self._me.children(recursive=True):
      try:
        if 'worker_binary' in ' '.join(child.cmdline()):
          workers += child.memory_info().rss
      except (self._psutil.NoSuchProcess, self._psutil.AccessDenied,
              self._psutil.ZombieProcess):
        pass
    self.peak_self = max(self.peak_self, mine)
    self.peak_workers = max(self.peak_workers, workers)
    self.peak_total = max(self.peak_total, mine + workers)

  def _run(self):
    while not self._stop.is_set():
      self.sample()
      time.sleep(self._interval)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.sample()


def _client_dataset(index: int, n: int, batch: int):
  import tensorflow as tf
  rng = np.random.default_rng(index)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.random((n, 28, 28, 1), np.float32),
      y=rng.integers(0, 62, n).astype(np.int32))).batch(batch)


def _model_fn():
  """The workload's model: the FEMNIST CNN (logits) or TFF's cnn_dropout (softmax)."""
  import tensorflow as tf
  from tasks import base, models
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  if FLAGS.model == 'femnist_cnn':
    return base.logits_classifier_fn(lambda: models.femnist_cnn(62), spec)
  return base.keras_model_fn(  # softmax output
      lambda: models.emnist_tff_model('cnn_dropout', 62), spec,
      tf.keras.losses.SparseCategoricalCrossentropy,
      lambda: [tf.keras.metrics.SparseCategoricalAccuracy()])


def _build_algorithm(model_fn):
  from tff_algos.algorithms import feddyn, scaffold
  if FLAGS.algorithm == 'feddyn':
    return feddyn.build_feddyn(model_fn, feddyn.FedDynConfig(
        alpha=0.01, client_learning_rate=0.05, local_steps=FLAGS.local_steps))
  return scaffold.build_scaffold(model_fn, scaffold.ScaffoldConfig(
      client_learning_rate=0.05, local_steps=FLAGS.local_steps))


def _fill(store, ids, initial) -> float:
  """Writes a distinct row for every client, checkpoints; the seconds it took."""
  import tensorflow as tf
  t0 = time.perf_counter()
  chunk = 50
  for start in range(0, len(ids), chunk):
    part = ids[start:start + chunk]
    store.scatter(part, [tf.nest.map_structure(
        lambda a, i=i: np.full(a.shape, 1e-6 * i, np.float32), initial)
        for i in range(start, start + len(part))])
  store.checkpoint(0)
  return time.perf_counter() - t0


class _Rounds:
  """Rounds of a stateful-client process against the store (gather -> TFF
  round -> scatter -> checkpoint), each phase timed."""

  def __init__(self, process, state, store, ids):
    self.process, self.state, self.store, self.ids = process, state, store, ids
    self.timings = collections.defaultdict(list)
    self._rng = np.random.default_rng(0)

  def run(self, r, checkpoint=True):
    """Round `r` on a random cohort: (cohort ids, their states before, output)."""
    cohort_idx = self._rng.choice(len(self.ids), FLAGS.clients_per_round, replace=False)
    cohort = [self.ids[i] for i in cohort_idx]
    data = [_client_dataset(int(i), FLAGS.examples_per_client, FLAGS.batch_size)
            for i in cohort_idx]
    t0 = time.perf_counter()
    states = self.store.gather(cohort)
    t1 = time.perf_counter()
    out = self.process.next(self.state, data, states)
    t2 = time.perf_counter()
    self.store.scatter(cohort, out.client_states)
    t3 = time.perf_counter()
    if checkpoint:
      self.store.checkpoint(r)
    t4 = time.perf_counter()
    self.state = out.state
    for key, seconds in (('gather', t1 - t0), ('round', t2 - t1), ('scatter', t3 - t2),
                         ('checkpoint', t4 - t3)):
      self.timings[key].append(seconds)
    return cohort, states, out


def _resumes_exactly(ids, initial, cohort, before) -> tuple[bool, object]:
  """Reopens the store, restores the last checkpoint: whether `cohort`'s rows
  are `before` again; and the reopened store (closed)."""
  import tensorflow as tf
  from tff_algos.training import client_state
  store = client_state.ClientStateStore(FLAGS.store_dir, ids, initial)
  store.restore(FLAGS.rounds)
  after = store.gather(cohort)
  exact = all(np.array_equal(a, b) for s, t in zip(before, after)
              for a, b in zip(tf.nest.flatten(s), tf.nest.flatten(t)))
  disk_gb = store.disk_bytes() / GB
  store.close()
  return exact, disk_gb


def _run_workload(ids, results) -> dict:
  """Fill, rounds, and the kill-and-resume check; measurements into `results`.
  Returns the per-phase timings."""
  from tff_algos.training import client_state
  from tff_algos.core import stateful_process
  process = _build_algorithm(_model_fn()).process
  state = process.initialize(stateful_process.Population(FLAGS.num_clients))
  initial = process.initial_client_state(state)
  store = client_state.ClientStateStore(FLAGS.store_dir, ids, initial)
  store.reset()
  results['model_parameters'] = store.row_floats
  results['store_capacity_gb'] = f'{store.capacity_bytes / GB:.2f}'
  if FLAGS.fill:  # every client has a (distinct) state
    results['fill_seconds'] = f'{_fill(store, ids, initial):.1f}'
  results['store_disk_gb_after_fill'] = f'{store.disk_bytes() / GB:.2f}'

  rounds = _Rounds(process, state, store, ids)
  for r in range(1, FLAGS.rounds + 1):
    _, _, out = rounds.run(r)
    loss = out.metrics['client_work']['train']['loss']
    print(f'round {r}: loss {float(loss):.4f}, round {rounds.timings["round"][-1]:.2f} s',
          flush=True)

  # A round past the last checkpoint, then "die" and resume.
  cohort, before, _ = rounds.run(FLAGS.rounds + 1, checkpoint=False)
  store.close()
  exact, disk_gb = _resumes_exactly(ids, initial, cohort, before)
  results['resume_check'] = 'exact' if exact else 'MISMATCH'
  results['store_disk_gb_end'] = f'{disk_gb:.2f}'
  return rounds.timings


def main(argv):
  del argv
  common.quiet_logs()
  from tff_algos import runtime

  if FLAGS.clients_per_round > FLAGS.num_clients:
    return common.fail('clients_per_round exceeds num_clients')
  ids = [f'client_{i:05d}' for i in range(FLAGS.num_clients)]
  results = collections.OrderedDict()
  runtime.install()
  try:
    with PeakRSS() as rss:
      timings = _run_workload(ids, results)
    for key in ('gather', 'round', 'scatter', 'checkpoint'):
      results[f'{key}_seconds_median'] = f'{np.median(timings[key][1:] or timings[key]):.3f}'
    results['rounds'] = FLAGS.rounds + 1
    results['num_clients'] = FLAGS.num_clients
    results['clients_per_round'] = FLAGS.clients_per_round
    results['peak_rss_self_gb'] = f'{rss.peak_self / GB:.3f}'
    results['peak_rss_workers_gb'] = f'{rss.peak_workers / GB:.3f}'
    results['peak_rss_total_gb'] = f'{rss.peak_total / GB:.3f}'
    results['ru_maxrss_self_gb'] = (
        f'{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB:.3f}')
  finally:
    runtime.shutdown()
    if not FLAGS.keep:
      shutil.rmtree(FLAGS.store_dir, ignore_errors=True)
  results['store_deleted'] = not os.path.exists(FLAGS.store_dir)
  for key, value in results.items():
    print(f'{key}: {value}')
  return 0 if results['resume_check'] == 'exact' else 1


if __name__ == '__main__':
  common.run(main)
