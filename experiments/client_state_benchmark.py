"""Client-state store at FEMNIST scale: a few FedDyn rounds in bounded memory.

    python -m experiments.client_state_benchmark --model=cnn_dropout   # 3,400 clients, 15 GB on disk
    python -m experiments.client_state_benchmark --num_clients=340 --rounds=3

Workload: the FEMNIST CNN of papers 000/004 (`tasks.models.femnist_cnn`,
870,334 parameters: 3,400 clients x 3.5 MB = 11 GB of client state) or TFF's
EMNIST `cnn_dropout` (`--model=cnn_dropout`, 1,206,590 parameters: 15.3 GB) on
synthetic data of EMNIST's shape; FedDyn (or SCAFFOLD)
keeps one model-sized state per client in a `core.client_state.ClientStateStore`
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

from experiments import common

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


def main(argv):
  del argv
  common.quiet_logs()
  import tensorflow as tf
  from tasks import base, models
  from tff_algos import feddyn, runtime, scaffold
  from tff_algos.core import client_state, stateful_process

  if FLAGS.clients_per_round > FLAGS.num_clients:
    return common.fail('clients_per_round exceeds num_clients')
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  if FLAGS.model == 'femnist_cnn':
    model_fn = base.logits_classifier_fn(lambda: models.femnist_cnn(62), spec)
  else:  # softmax output
    model_fn = base.keras_model_fn(
        lambda: models.emnist_tff_model('cnn_dropout', 62), spec,
        tf.keras.losses.SparseCategoricalCrossentropy,
        lambda: [tf.keras.metrics.SparseCategoricalAccuracy()])
  ids = [f'client_{i:05d}' for i in range(FLAGS.num_clients)]
  results = collections.OrderedDict()
  runtime.install()
  try:
    with PeakRSS() as rss:
      if FLAGS.algorithm == 'feddyn':
        algorithm = feddyn.build_feddyn(model_fn, feddyn.FedDynConfig(
            alpha=0.01, client_learning_rate=0.05, local_steps=FLAGS.local_steps))
      else:
        algorithm = scaffold.build_scaffold(model_fn, scaffold.ScaffoldConfig(
            client_learning_rate=0.05, local_steps=FLAGS.local_steps))
      process = algorithm.process
      state = process.initialize(stateful_process.Population(FLAGS.num_clients))
      initial = process.initial_client_state(state)
      store = client_state.ClientStateStore(FLAGS.store_dir, ids, initial)
      store.reset()
      results['model_parameters'] = store.row_floats
      results['store_capacity_gb'] = f'{store.capacity_bytes / GB:.2f}'

      if FLAGS.fill:  # every client has a (distinct) state
        t0 = time.perf_counter()
        chunk = 50
        for start in range(0, len(ids), chunk):
          part = ids[start:start + chunk]
          store.scatter(part, [tf.nest.map_structure(
              lambda a, i=i: np.full(a.shape, 1e-6 * i, np.float32), initial)
              for i in range(start, start + len(part))])
        store.checkpoint(0)
        results['fill_seconds'] = f'{time.perf_counter() - t0:.1f}'
      results['store_disk_gb_after_fill'] = f'{store.disk_bytes() / GB:.2f}'

      rng = np.random.default_rng(0)
      timings = collections.defaultdict(list)

      def one_round(r, checkpoint=True):
        cohort_idx = rng.choice(len(ids), FLAGS.clients_per_round, replace=False)
        cohort = [ids[i] for i in cohort_idx]
        data = [_client_dataset(int(i), FLAGS.examples_per_client, FLAGS.batch_size)
                for i in cohort_idx]
        t0 = time.perf_counter()
        states = store.gather(cohort)
        t1 = time.perf_counter()
        out = process.next(state_box[0], data, states)
        t2 = time.perf_counter()
        store.scatter(cohort, out.client_states)
        t3 = time.perf_counter()
        if checkpoint:
          store.checkpoint(r)
        t4 = time.perf_counter()
        state_box[0] = out.state
        timings['gather'].append(t1 - t0)
        timings['round'].append(t2 - t1)
        timings['scatter'].append(t3 - t2)
        timings['checkpoint'].append(t4 - t3)
        return cohort, states, out

      state_box = [state]
      for r in range(1, FLAGS.rounds + 1):
        cohort, _, out = one_round(r)
        loss = out.metrics['client_work']['train']['loss']
        print(f'round {r}: loss {float(loss):.4f}, round {timings["round"][-1]:.2f} s',
              flush=True)

      # A round past the last checkpoint, then "die" and resume.
      cohort, before, _ = one_round(FLAGS.rounds + 1, checkpoint=False)
      store.close()
      store = client_state.ClientStateStore(FLAGS.store_dir, ids, initial)
      store.restore(FLAGS.rounds)
      after = store.gather(cohort)
      exact = all(np.array_equal(a, b) for s, t in zip(before, after)
                  for a, b in zip(tf.nest.flatten(s), tf.nest.flatten(t)))
      results['resume_check'] = 'exact' if exact else 'MISMATCH'
      results['store_disk_gb_end'] = f'{store.disk_bytes() / GB:.2f}'
      store.close()

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
