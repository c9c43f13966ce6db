"""One client's local work on the EMNIST CNN: FedAvg's loop vs each algorithm's.

Where does phase (c) of `experiments.benchmark` spend its extra time? Here
every variant is one `tf.function` running `local_training.run_local_training`
(K = 10 steps, batch 20, the benchmark's synthetic client) with exactly the
step transform / optimiser its algorithm uses, from the same weights on the
same data. The variants are timed in alternation (each repetition runs every
variant once, in a random order) so that the machine's load drifts over all of them alike; each prints the
median of its per-repetition ratios to FedAvg's loop.

    nice -n 19 python -m experiments.step_cost --repetitions=30

With --rounds=fedprox,scaffold,... it times whole rounds instead (10 clients,
phase (c)'s hyperparameters and its FedAvg baselines, in-process backend):
each named algorithm's round next to our FedAvg's (SGD) and FedAvg's with
client Adam, in a random order per repetition, so that the round plumbing
(client state in and out, finiteness checks, counting passes) is included.
"""

from __future__ import annotations

import collections
import time

from absl import flags
import numpy as np

from experiments.lib import common
from experiments.lib import runtime_flags

flags.adopt_module_key_flags(runtime_flags)
flags.DEFINE_integer('repetitions', 30, 'Alternating repetitions of every variant.')
flags.DEFINE_list('variants', None, 'Only these variants (default: all).')
flags.DEFINE_list('rounds', None, 'Time whole rounds of these registry algorithms '
                  'instead of the local loops.')
FLAGS = flags.FLAGS

STEPS = 10


def _variants(task):
  """name -> (optimizer, correction-or-transform builder, optimizer_state builder)."""
  import tensorflow as tf
  import tensorflow_federated as tff
  from tff_algos.algorithms import feddyn, fedprox, scaffold
  from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
  from tff_algos.core import local_training

  sgd = tff.learning.optimizers.build_sgdm(0.1)
  adam_tff = tff.learning.optimizers.build_adam(0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
  rule = gbo_optimizers.Adam()
  model = task.model_fn()
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in model.trainable_variables)
  stats = rule.initialize(specs)
  # Non-trivial fixed statistics (count > 0, v > 0), as after a few rounds.
  stats = collections.OrderedDict(
      count=tf.constant(3), m=tuple(tf.fill(s.shape, 0.01) for s in specs),
      v=tuple(tf.fill(s.shape, 1e-4) for s in specs))
  dyn = feddyn.FedDynConfig()
  scf = scaffold.ScaffoldConfig()

  def feddyn_corr(x_t):
    g_k = [tf.zeros_like(w) for w in x_t.trainable]
    alpha_k = feddyn.client_alpha(dyn, lambda: tf.constant(200, tf.int64), 200.0)
    srv = list(x_t.trainable)
    return lambda w, g: feddyn.local_gradient(dyn, g, w, srv, g_k, alpha_k)

  def scaffold_corr(x_t):
    c_i = [tf.zeros_like(w) for w in x_t.trainable]
    c = [tf.zeros_like(w) for w in x_t.trainable]
    fixed = scaffold.drift(c_i, c)
    return lambda w, g: scaffold.corrected_gradient(scf, g, w, fixed)

  return collections.OrderedDict(
      fedavg=(sgd, None, None),
      # FedAvg's loop after a counting pass over the client's data (what FedDyn
      # ran for an alpha_k it does not use without adaptive_alpha).
      count_pass=(sgd, None, None),
      fedprox=(sgd, fedprox.proximal_correction(0.01), None),
      feddyn=(sgd, feddyn_corr, None),
      scaffold=(sgd, scaffold_corr, None),
      adam=(adam_tff, None, None),
      fedgbo_adam=(gbo_optimizers.FixedStatistics(rule, stats), None, None),
      mfl_adam=(gbo_optimizers.MovingStatistics(rule), None,
                lambda: gbo_optimizers.MovingStatistics(rule).initialize(specs)),
  ), local_training


def _print(times: dict) -> None:
  base = np.array(times['fedavg'])
  print(f'{"variant":12s} {"ms":>7s} {"ratio":>6s}  (median of {len(base)} '
        'alternating repetitions; ratio = median of per-repetition ratios to fedavg)')
  for name, t in times.items():
    t = np.array(t)
    print(f'{name:12s} {1e3 * np.median(t):7.1f} {np.median(t / base):6.3f}', flush=True)


def _time_alternating(fns: dict, repetitions: int) -> dict:
  """name -> seconds of each call, every repetition calling each fn once in a
  random order (no variant always first or last)."""
  times = collections.OrderedDict((name, []) for name in fns)
  order = np.random.default_rng(0)
  for _ in range(repetitions):
    for name in order.permutation(list(fns)):
      t0 = time.perf_counter()
      fns[name]()
      times[name].append(time.perf_counter() - t0)
  return times


def _round_costs(names):
  from experiments.lib import timing
  from tff_algos.algorithms import fedopt
  from tff_algos.flags.algorithm_flags import HParams
  task = timing.synthetic_task('emnist_cnn', timing.CLIENTS, 0)  # pylint: disable=protected-access
  data = [task.client_dataset(c) for c in task.client_ids]
  candidates = (HParams(client_learning_rate=0.1, local_steps=STEPS),
                HParams(client_learning_rate=0.1),
                HParams(client_optimizer='adam', client_learning_rate=0.01, local_steps=STEPS))
  with runtime_flags.managed_context():
    rounds = collections.OrderedDict()
    for name, optimizer, learning_rate in (('fedavg', 'sgd', 0.1), ('fedavg_adam', 'adam', 0.01)):
      rounds[name] = timing.Rounds(fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
          client_optimizer=optimizer, client_learning_rate=learning_rate,
          local_steps=STEPS)).process, data)
    for name in names:
      rounds[name], _ = timing.algorithm_rounds(name, task, data, candidates)
    for r in rounds.values():
      r.time(2)  # warm-up
    _print(_time_alternating({k: r.time for k, r in rounds.items()}, FLAGS.repetitions))


def main(argv):
  del argv
  if FLAGS.rounds:
    return _round_costs(FLAGS.rounds)
  import tensorflow as tf
  import tensorflow_federated as tff
  from experiments.lib import timing
  task = timing.synthetic_task('emnist_cnn', 1, 0)  # pylint: disable=protected-access
  dataset = task.client_dataset(task.client_ids[0])
  variants, local_training = _variants(task)
  if FLAGS.variants:
    variants = collections.OrderedDict(
        (k, v) for k, v in variants.items() if k in FLAGS.variants or k == 'fedavg')

  fns = {}
  for name, (optimizer, correction, state_fn) in variants.items():
    model = task.model_fn()
    x_t = tf.nest.map_structure(lambda v: v.read_value(),
                                tff.learning.models.ModelWeights.from_model(model))

    @tf.function
    def run(ds, model=model, optimizer=optimizer, correction=correction,
            state_fn=state_fn, x_t=x_t, count=name == 'count_pass'):
      if count:
        local_training.count_examples(ds)
      outcome = local_training.run_local_training(
          model, optimizer, None, x_t, ds, STEPS, -1,
          correction_fn=None if correction is None else correction(x_t),
          optimizer_state=None if state_fn is None else state_fn())
      return outcome.num_steps

    run(dataset)
    assert int(run(dataset)) == STEPS
    fns[name] = run

  _print(_time_alternating({name: lambda run=run: run(dataset) for name, run in fns.items()},
                           FLAGS.repetitions))


if __name__ == '__main__':
  common.run(main)
