"""Simulation speed, as ratios measured in one run (issue 7's benchmark).

    python -m experiments.benchmark --quick      # ~3 minutes on 2 cores

Workload: the EMNIST CNN of papers 000/004 (conv32-conv64-FC512-62) on
synthetic data of EMNIST's shape, 10 clients x 10 local SGD steps x batch 20
per round. Reports (a) our FedAvg's seconds per round over the same 100 SGD
steps in one plain `tf.function` loop (the compute floor); (b) our FedAvg over
TFF's `build_weighted_fed_avg` on the same data; (c) every algorithm over our
FedAvg; (d) seconds per round for 10, 20, 40 clients; (e) peak memory of this
process and of the TFF worker; (f) milliseconds per round of the quadratic toy
(one parameter, 10 clients, one example each), where compute is nil. Timings
are medians over the measured rounds after warm-up rounds. The LAST line is
one JSON object.
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
FLAGS = flags.FLAGS

CLIENTS, STEPS, BATCH = 10, 10, 20


def _median_round_time(process, state, data, rounds, warmup=2):
  for _ in range(warmup):
    state = process.next(state, data).state
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    state = process.next(state, data).state
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main(argv):
  del argv
  common.quiet_logs()
  import psutil
  import tensorflow as tf
  import tensorflow_federated as tff
  from tasks import base, models, partition, quadratic
  from tff_algos import fedopt, local_update, nastya, runtime
  from tff_algos.core import local_training, optimizers

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

  with runtime.managed_context() as ctx:
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

    # (c) every algorithm on the same clients, relative to our FedAvg.
    algorithms = {
        'fedsgd': fedopt.build_fedsgd(task.model_fn),
        'local_update(reptile)': local_update.build_local_update(
            task.model_fn, local_update.LocalUpdateConfig(theta=(1.0,) * STEPS)),
        'local_update_decay': local_update.build_local_update_decay(
            task.model_fn, local_update.LocalUpdateConfig(theta=(1.0,) * STEPS)),
        'nastya': nastya.build_nastya(task.model_fn, nastya.NastyaConfig()),
    }
    result['per_algorithm'] = {'fedavg': 1.0}
    for name, alg in algorithms.items():
      t = _median_round_time(alg.process, alg.process.initialize(), data[10], rounds)
      result['per_algorithm'][name] = t / ours_s

    # (d) linear cost in the cohort size.
    result['scaling'] = {
        str(m): _median_round_time(fedavg.process, fedavg.process.initialize(), data[m],
                                   rounds) for m in (10, 20, 40)}

    # (e) peak memory.
    worker = psutil.Process(ctx.pids[0])
    result['peak_memory_mb'] = dict(
        python=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        worker_rss_now=worker.memory_info().rss / 2**20)

    # (f) the fixed cost of a round: nothing to compute.
    toy = quadratic.build_quadratic(num_runs=1, num_clients=CLIENTS)
    toy_alg = fedopt.build_fedopt(toy.model_fn, fedopt.FedOptConfig(
        client_optimizer=sgd, local_steps=1, uniform_weighting=True))
    toy_data = [toy.client_dataset(c) for c in toy.client_ids]
    result['fixed_ms_per_round'] = 1000 * _median_round_time(
        toy_alg.process, toy_alg.process.initialize(), toy_data, max(rounds, 10) * 2)

  print(f"our FedAvg {ours_s:.3f} s/round; pure-TF floor {floor_s:.3f} s; "
        f"TFF built-in {builtin_s:.3f} s/round")
  print(f"overhead vs pure TF {result['overhead_vs_pure_tf']:.2f}x (target <= 1.15); "
        f"vs TFF built-in {result['ratio_vs_tff_builtin']:.2f}x (target <= 1.0); "
        f"fixed cost {result['fixed_ms_per_round']:.0f} ms/round (target <= 20)")
  for name, r in result['per_algorithm'].items():
    print(f'  {name:24s} {r:.2f}x FedAvg')
  print('  scaling: ' + ', '.join(f'{m} clients {s:.3f} s' for m, s in result['scaling'].items()))
  print(json.dumps(result))
  return 0


if __name__ == '__main__':
  app.run(main)
