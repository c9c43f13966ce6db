"""Simulation speed, as ratios measured in one run (issue 7's benchmark).

    python -m experiments.benchmark --quick      # ~3 minutes on 2 cores
    python -m experiments.benchmark --quick --backend=inprocess   # GPU if visible
    python -m experiments.benchmark --quick --workers=2           # 2 local workers

Workload: the EMNIST CNN of papers 000/004 (conv32-conv64-FC512-62) on
synthetic data of EMNIST's shape, 10 clients x 10 local SGD steps x batch 20
per round. Reports (a) our FedAvg's seconds per round over the same 100 SGD
steps in one plain `tf.function` loop (the compute floor); (b) our FedAvg over
TFF's `build_weighted_fed_avg` on the same data; (c) every algorithm over our
FedAvg; (d) seconds per round for 10, 20, 40 clients; (e) peak memory of this
process and of the TFF worker; (f) milliseconds per round of the quadratic toy
(one parameter, 10 clients, one example each), where compute is nil. Timings
are medians over the measured rounds after warm-up rounds. The LAST line is
one JSON object (it also names the backend and the devices used).

Every measurement runs on the backend chosen by --backend / --workers (see
`tff_algos/runtime`); the pure-TF floor always runs in this process, i.e. on
the GPU when TensorFlow sees one. (c) covers every algorithm of
`tff_algos.registry` with default hyperparameters and K=10 local steps;
--quick measures 1 round after 1 warm-up round for those.
"""

from __future__ import annotations

import collections
import json
import resource
import time

from absl import app
from absl import flags
import numpy as np

from experiments import common

flags.DEFINE_bool('quick', False, 'Fewer measured rounds (for CI-sized machines).')
flags.DEFINE_integer('seed', 0, 'Seed of the synthetic data.')
flags.DEFINE_enum('backend', 'cpp', ['cpp', 'inprocess'], 'Execution backend.')
flags.DEFINE_string('workers', None, 'cpp backend: worker count or host:port,... '
                    '(clients split over several TFF workers).')
FLAGS = flags.FLAGS

CLIENTS, STEPS, BATCH = 10, 10, 20


def _median_round_time(process, state, data, rounds, warmup=2, client_states=None):
  """Median seconds of `process.next` (stateful-client processes get their states)."""
  times = []
  for r in range(warmup + rounds):
    t0 = time.perf_counter()
    if client_states is None:
      state = process.next(state, data).state
    else:
      out = process.next(state, data, client_states)
      state, client_states = out.state, out.client_states
    if r >= warmup:
      times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main(argv):
  del argv
  common.quiet_logs()
  import psutil
  import tensorflow as tf
  import tensorflow_federated as tff
  from tasks import base, models, partition, quadratic
  from tff_algos import fedopt, registry, runtime
  from tff_algos.hparams import HParams
  from tff_algos.core import local_training, optimizers, stateful_process

  runtime.prepare(FLAGS.backend)  # before TensorFlow runs an op
  rounds = 3 if FLAGS.quick else 10
  rng = np.random.default_rng(FLAGS.seed)
  n_clients = 40
  per_client = STEPS * BATCH
  x = rng.random((n_clients * per_client, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, 62, n_clients * per_client).astype(np.int32)
  parts = np.array_split(np.arange(len(y)), n_clients)
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  task = base.Task(
      name='emnist_shaped', train_data=partition.to_client_data(
          collections.OrderedDict(x=x, y=y), parts),
      preprocess_fn=lambda ds: ds.batch(BATCH),
      model_fn=base.logits_classifier_fn(models.femnist_cnn, spec))
  data = {m: [task.client_dataset(c) for c in task.client_ids[:m]] for m in (10, 20, 40)}
  sgd = optimizers.OptimizerSpec('sgd', 0.1)
  result = {}

  runtime.check_backend(FLAGS.backend, FLAGS.workers)
  result['backend'] = FLAGS.backend + (f' workers={FLAGS.workers}' if FLAGS.workers else '')
  result['devices'] = [d.name for d in tf.config.list_logical_devices()]
  with runtime.managed_context(backend=FLAGS.backend, workers=FLAGS.workers) as ctx:
    # (a) the compute floor: 100 SGD steps in one tf.function, no TFF.
    model = task.model_fn()
    weights = tff.learning.models.ModelWeights.from_model(model)
    init = tf.nest.map_structure(lambda v: v.read_value(), weights)
    floor_ds = task.train_data.create_tf_dataset_for_client(
        task.client_ids[0]).repeat(CLIENTS).batch(BATCH)
    opt = sgd.build()

    @tf.function
    def floor_loop():
      return local_training.run_local_training(
          model, opt, None, init, floor_ds, CLIENTS * STEPS, 1).num_steps

    floor_loop()
    floor = []
    for _ in range(rounds):
      t0 = time.perf_counter()
      assert int(floor_loop()) == CLIENTS * STEPS
      floor.append(time.perf_counter() - t0)
    floor_s = float(np.median(floor))

    def ours_fedavg():
      return fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
          client_optimizer=sgd, local_steps=STEPS))

    fedavg = ours_fedavg()
    ours_s = _median_round_time(fedavg.process, fedavg.process.initialize(), data[10], rounds)
    builtin = tff.learning.algorithms.build_weighted_fed_avg(
        task.model_fn, client_optimizer_fn=sgd.build(),
        server_optimizer_fn=optimizers.OptimizerSpec('sgd', 1.0).build())
    builtin_s = _median_round_time(builtin, builtin.initialize(), data[10], rounds)
    result['seconds_per_round'] = dict(ours_fedavg=ours_s, tff_builtin=builtin_s,
                                       pure_tf_floor=floor_s)
    result['overhead_vs_pure_tf'] = ours_s / floor_s
    result['ratio_vs_tff_builtin'] = ours_s / builtin_s

    # (c) every algorithm of the registry on the same clients, over our FedAvg.
    result['per_algorithm'] = {'fedavg': 1.0}
    result['per_algorithm_not_run'] = {}
    candidates = (  # K=10 SGD steps; else one epoch (fedrr, nastya); else Adam (mime, mfl)
        HParams(client_learning_rate=0.1, local_steps=STEPS),
        HParams(client_learning_rate=0.1),
        HParams(client_optimizer='adam', client_learning_rate=0.01, local_steps=STEPS))
    for name in sorted(registry.ALGORITHMS):
      if name == 'fedavg':
        continue
      try:
        alg, error = None, None
        for hp in candidates:
          try:
            alg = registry.build(name, task.model_fn, hp)
            break
          except ValueError as e:
            error = e
        if alg is None:
          raise error
        stateful = getattr(alg, 'stateful_clients', False)
        state = (alg.process.initialize(stateful_process.population_of(
            task, alg.process.needs_mean_examples)) if stateful else alg.process.initialize())
        t = _median_round_time(
            alg.process, state, data[10], 1 if FLAGS.quick else rounds,
            warmup=1 if FLAGS.quick else 2,
            client_states=[alg.process.initial_client_state(state)] * CLIENTS
            if stateful else None)
      except Exception as e:  # pylint: disable=broad-except
        result['per_algorithm_not_run'][name] = f'{type(e).__name__}: {e}'[:200]
        continue
      result['per_algorithm'][name] = t / ours_s

    # (d) linear cost in the cohort size.
    result['scaling'] = {
        str(m): _median_round_time(fedavg.process, fedavg.process.initialize(), data[m],
                                   rounds) for m in (10, 20, 40)}

    # (e) peak memory.
    result['peak_memory_mb'] = dict(
        python=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    for i, pid in enumerate(ctx.pids):
      result['peak_memory_mb'][f'worker{i}_rss_now'] = psutil.Process(pid).memory_info().rss / 2**20
    for gpu in tf.config.list_logical_devices('GPU'):
      result['peak_memory_mb'][gpu.name] = tf.config.experimental.get_memory_info(
          gpu.name)['peak'] / 2**20

    # (f) the fixed cost of a round: nothing to compute.
    toy = quadratic.build_quadratic(num_runs=1, num_clients=CLIENTS)
    toy_alg = fedopt.build_fedopt(toy.model_fn, fedopt.FedOptConfig(
        client_optimizer=sgd, local_steps=1, uniform_weighting=True))
    toy_data = [toy.client_dataset(c) for c in toy.client_ids]
    result['fixed_ms_per_round'] = 1000 * _median_round_time(
        toy_alg.process, toy_alg.process.initialize(), toy_data, max(rounds, 10) * 2)

  print(f"backend {result['backend']} on {', '.join(result['devices'])}")
  print(f"our FedAvg {ours_s:.3f} s/round; pure-TF floor {floor_s:.3f} s; "
        f"TFF built-in {builtin_s:.3f} s/round")
  print(f"overhead vs pure TF {result['overhead_vs_pure_tf']:.2f}x (target <= 1.15); "
        f"vs TFF built-in {result['ratio_vs_tff_builtin']:.2f}x (target <= 1.0); "
        f"fixed cost {result['fixed_ms_per_round']:.0f} ms/round (target <= 20)")
  for name, r in result['per_algorithm'].items():
    print(f'  {name:24s} {r:.2f}x FedAvg')
  for name, err in result['per_algorithm_not_run'].items():
    print(f'  {name:24s} not run: {err}')
  print('  scaling: ' + ', '.join(f'{m} clients {s:.3f} s' for m, s in result['scaling'].items()))
  print(json.dumps(result))
  return 0


if __name__ == '__main__':
  app.run(main)
