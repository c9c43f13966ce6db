"""Simulation speed, as ratios measured in one run.

    python -m experiments.benchmark --quick      # in-process backend (GPU if visible)
    python -m experiments.benchmark --quick --backend=cpp         # TFF's C++ worker
    python -m experiments.benchmark --quick --backend=cpp --workers=2  # 2 local workers

Workload: the EMNIST CNN of papers 000/004 (conv32-conv64-FC512-62) on
synthetic data of EMNIST's shape, 10 clients x 10 local SGD steps x batch 20
per round. Reports (a) our FedAvg's seconds per round over the same 100 SGD
steps in one plain `tf.function` loop (the compute floor); (b) our FedAvg over
TFF's `build_weighted_fed_avg` on the same data; (c) every algorithm over our
FedAvg; (d) seconds per round for 10, 20, 40 clients; (e) peak memory of this
process and of the TFF worker; (f) milliseconds per round of the quadratic toy
(one parameter, 10 clients, one example each), where compute is nil; with
--models, (g) seconds and rounds per second of our FedAvg (same work as (a))
on other models on synthetic data of their task's shape (EMNIST CNN,
CIFAR-100 ResNet-18), for GPU vs CPU runs (--models_only skips (a)-(f)). Timings
are medians over the measured rounds after warm-up rounds; the ratios (a),
(b), (c) are medians of ratios of runs measured side by side (this machine's
speed drifts by tens of percent between minutes). The LAST line is one JSON
object (it also names the backend and the devices used).

Every measurement runs on the backend chosen by --backend / --workers (see
`tff_algos/runtime`); the pure-TF floor always runs in this process, i.e. on
the GPU when TensorFlow sees one. (c) covers every algorithm of
`tff_algos.algorithms.registry` with default hyperparameters and K=10 local steps,
over our FedAvg with the same client optimiser (those that need Adam over a
FedAvg running Adam); --quick measures 1 round after 1 warm-up round for those. The JSON also
holds the per-repetition ratios of (a), the wall seconds of each part, and
(a) split in two: the same clients' loops in plain TF (one tf.function call
per client, no TFF) over the floor, and our round over those.

The in-process backend trains `concurrent_clients` clients at a time (default:
one per CPU core up to 4; in the JSON), the floor and the plain-TF loops one
step after another: with 2 at a time our round can take less than the floor.
`--concurrent_clients=1` measures our round one client at a time.
"""

from __future__ import annotations

import json
import resource
import time

from absl import flags
import numpy as np

from experiments.lib import common
from experiments.lib import runtime_flags
from experiments.lib import timing

flags.adopt_module_key_flags(runtime_flags)  # --help lists them

flags.DEFINE_bool('quick', False, 'Fewer measured rounds (for CI-sized machines).')
flags.DEFINE_list('algorithms', None, '(c) only these registry algorithms (default: all).')
flags.DEFINE_integer('seed', 0, 'Seed of the synthetic data.')
flags.DEFINE_list('models', [],
                  '(g) also time FedAvg rounds of these models on synthetic data of '
                  'their task\'s shape (seconds and rounds per second; same work as '
                  '(a)): emnist_cnn, cifar100_resnet18. Run it once with the GPU and '
                  'once with CUDA_VISIBLE_DEVICES= for GPU vs CPU.')
flags.DEFINE_bool('models_only', False, 'Measure only (g), skipping (a)-(f).')
flags.DEFINE_bool('trainer_loop', True,
                  '(h) time the trainer binary end to end: trainer_ms_per_round (the '
                  'marginal cost of a round of the quadratic toy, from two run lengths, '
                  'and inside the longer run: trainer_ms_per_round_in_run), '
                  'startup_s, and grid_runs_per_minute (a 12-configuration grid).')
flags.DEFINE_bool('trainer_loop_only', False, 'Measure only (h).')
FLAGS = flags.FLAGS

def _model_timings(model: str, rounds: int, seed: int) -> dict:
  """(g): our FedAvg on `model` (CLIENTS x STEPS x BATCH, as (a)) and its floor,
  interleaved; medians."""
  from tff_algos.algorithms import fedopt
  from tff_algos.core import optimizers
  task = timing.synthetic_task(model, timing.CLIENTS, seed)
  sgd = optimizers.OptimizerSpec('sgd', 0.01)
  plain = timing.PlainTF(task, sgd)
  fedavg = timing.Rounds(fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
      client_learning_rate=sgd.learning_rate, local_steps=timing.STEPS)).process,
                   [task.client_dataset(c) for c in task.client_ids])
  plain.floor_once(), fedavg.time(2)
  times = np.array([(plain.floor_once(), fedavg.time()) for _ in range(rounds)])
  floor_s, round_s = np.median(times, axis=0)
  return dict(seconds_per_round=float(round_s), rounds_per_second=float(1 / round_s),
              pure_tf_floor_seconds=float(floor_s),
              overhead_vs_pure_tf=float(np.median(times[:, 1] / times[:, 0])))


def _measure_round_costs(result: dict, ctx, rounds: int, phase_done) -> None:
  """(a)-(f) into `result`, on the backend of the installed context `ctx`."""
  import tensorflow_federated as tff
  from tff_algos.algorithms import fedopt
  from tff_algos.core import optimizers
  task = timing.synthetic_task('emnist_cnn', 40, FLAGS.seed)
  data = {m: [task.client_dataset(c) for c in task.client_ids[:m]] for m in (10, 20, 40)}
  sgd = optimizers.OptimizerSpec('sgd', 0.1)
  # (a) the compute floor: 100 SGD steps in one tf.function, no TFF.
  plain = timing.PlainTF(task, sgd, trace_client=data[10][0])

  fedavg = timing.Rounds(fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
      client_learning_rate=sgd.learning_rate, local_steps=timing.STEPS)).process, data[10])
  builtin = timing.Rounds(tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, client_optimizer_fn=sgd.build(),
      server_optimizer_fn=optimizers.OptimizerSpec('sgd', 1.0).build()), data[10])

  # Warm-up (tracing, first-call costs), then all interleaved, so that the
  # machine's drift (measured: +-30% between minutes on this VM) hits each
  # ratio's numerator and denominator alike; ratios are medians of the
  # per-repetition ratios. The overhead (a) is the ratio closest to 1, so it
  # is in every repetition; TFF's built-in (b) and the per-client plain-TF
  # reference each in every other one.
  plain.floor_once(), plain.per_client_once(data[10])
  fedavg.time(2), builtin.time(1 if FLAGS.quick else 2)
  times = np.array([
      (plain.floor_once(), fedavg.time(), builtin.time() if i % 2 == 0 else np.nan,
       plain.per_client_once(data[10]) if i % 2 == 1 else np.nan)
      for i in range((3 if FLAGS.quick else 2) * rounds)])
  floor_s, ours_s, builtin_s, per_client_s = np.nanmedian(times, axis=0)
  result['seconds_per_round'] = dict(ours_fedavg=ours_s, tff_builtin=builtin_s,
                                     pure_tf_floor=floor_s, pure_tf_per_client=per_client_s)
  result['overhead_vs_pure_tf'] = float(np.median(times[:, 1] / times[:, 0]))
  result['overhead_repetitions'] = [round(r, 3) for r in times[:, 1] / times[:, 0]]
  result['ratio_vs_tff_builtin'] = float(np.nanmedian(times[:, 1] / times[:, 2]))
  # Of (a): what the same loops cost in plain TF, one tf.function call per
  # client (a client restarts from the server's weights: a new loop, new
  # iterator, the delta), and what our round adds to that.
  result['pure_tf_per_client_vs_floor'] = float(np.nanmedian(times[:, 3] / times[:, 0]))
  result['overhead_vs_pure_tf_per_client'] = float(np.nanmedian(times[:, 1] / times[:, 3]))
  phase_done('floor_fedavg_builtin')
  _per_algorithm(result, task, data[10], fedavg, rounds)
  phase_done('per_algorithm')
  # (d) linear cost in the cohort size (10 clients: FedAvg of (a)).
  result['scaling'] = {'10': result['seconds_per_round']['ours_fedavg']}
  for m in (20, 40):
    result['scaling'][str(m)] = timing.Rounds(fedavg.process, data[m]).median(
        1 if FLAGS.quick else rounds, warmup=1 if FLAGS.quick else 2)
  phase_done('scaling')
  _peak_memory(result, ctx)
  result['fixed_ms_per_round'] = _fixed_ms_per_round(sgd, rounds)
  phase_done('fixed_cost')


def _per_algorithm(result: dict, task, data: list, fedavg, rounds: int) -> None:
  """(c) every algorithm of the registry on the same clients, over our FedAvg
  with the same client optimiser (like with like).

  Algorithms that need a client optimiser with statistics (FedGBO, MFL,
  Mimelite, MimeXlite reject plain SGD) run Adam; they are compared with our
  FedAvg running TFF's Adam at the same learning rate, and their ratio over
  the SGD FedAvg is kept too (`per_algorithm_vs_sgd_fedavg`): Adam's own
  update costs ~1.3x SGD's per local step on this CNN (`experiments.step_cost`).
  """
  from tff_algos.algorithms import fedopt, registry
  from tff_algos.flags.algorithm_flags import HParams
  result['per_algorithm'] = {'fedavg': 1.0}
  pairs = result['per_algorithm_pairs'] = 3 if FLAGS.quick else rounds
  result['per_algorithm_baseline'] = {}
  result['per_algorithm_vs_sgd_fedavg'] = {}
  result['per_algorithm_not_run'] = {}
  adam = HParams(client_optimizer='adam', client_learning_rate=0.01, local_steps=timing.STEPS)
  candidates = (  # K=10 SGD steps; else one epoch (fedrr, nastya); else Adam (mime, mfl)
      HParams(client_learning_rate=0.1, local_steps=timing.STEPS),
      HParams(client_learning_rate=0.1), adam)
  fedavg_adam = None
  for name in sorted(registry.ALGORITHMS):
    if name == 'fedavg' or (FLAGS.algorithms is not None and name not in FLAGS.algorithms):
      continue
    try:
      other, hp = timing.algorithm_rounds(name, task, data, candidates)
      baseline = fedavg
      if hp is adam:
        if fedavg_adam is None:
          fedavg_adam = timing.Rounds(fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(
              client_optimizer='adam', client_learning_rate=adam.client_learning_rate,
              local_steps=timing.STEPS)).process, data)
          fedavg_adam.time(1 if FLAGS.quick else 2)  # warm-up
        baseline = fedavg_adam
      other.time(1 if FLAGS.quick else 2)  # warm-up
      # Each of its rounds next to one of FedAvg's (see above). --quick takes 3
      # pairs, not 1: one pair's ratio moved +-0.1 between runs on this VM.
      times = np.array([(other.time(), baseline.time(),
                         fedavg.time() if baseline is not fedavg else np.nan)
                        for _ in range(pairs)])
    except Exception as e:  # pylint: disable=broad-except
      result['per_algorithm_not_run'][name] = f'{type(e).__name__}: {e}'[:200]
      continue
    result['per_algorithm'][name] = float(np.median(times[:, 0] / times[:, 1]))
    if baseline is not fedavg:
      result['per_algorithm_baseline'][name] = 'fedavg with client adam'
      result['per_algorithm_vs_sgd_fedavg'][name] = float(np.median(times[:, 0] / times[:, 2]))


def _peak_memory(result: dict, ctx) -> None:
  """(e) peak memory of this process, the workers and the GPUs."""
  import psutil
  import tensorflow as tf
  result['peak_memory_mb'] = dict(
      python=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
  for i, pid in enumerate(ctx.pids):
    result['peak_memory_mb'][f'worker{i}_rss_now'] = psutil.Process(pid).memory_info().rss / 2**20
  for gpu in tf.config.list_logical_devices('GPU'):
    result['peak_memory_mb'][gpu.name] = tf.config.experimental.get_memory_info(
        gpu.name)['peak'] / 2**20


def _fixed_ms_per_round(sgd, rounds: int) -> float:
  """(f) the fixed cost of a round in milliseconds: nothing to compute."""
  from tasks import quadratic
  from tff_algos.algorithms import fedopt
  toy = quadratic.build_quadratic(num_runs=1, num_clients=timing.CLIENTS)
  toy_alg = fedopt.build_fedopt(toy.model_fn, fedopt.FedOptConfig(
      client_learning_rate=sgd.learning_rate, local_steps=1, uniform_weighting=True))
  toy_data = [toy.client_dataset(c) for c in toy.client_ids]
  return 1000 * timing.Rounds(toy_alg.process, toy_data).median(max(rounds, 10) * 2)


def _timed_run(module: str, args: list[str], out_root: str) -> float:
  """Wall seconds of `python -m module args` (a fresh process, as a user runs it)."""
  return _launched_run(module, args, out_root)[0]


def _launched_run(module: str, args: list[str], out_root: str) -> tuple[float, float]:
  """(wall seconds, `time.time()` at launch) of `python -m module args`."""
  import subprocess
  import sys
  argv = [sys.executable, '-m', module, f'--root_output_dir={out_root}',
          '--noprogress', *args]
  launched = time.time()
  started = time.perf_counter()
  proc = subprocess.run(argv, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - started
  if proc.returncode != 0:
    raise RuntimeError(f'{" ".join(argv[1:])} failed: {proc.stderr.strip()[-300:]}')
  return seconds, launched


def _row_walls(run_dir: str) -> dict[int, float]:
  """{round: `time.time()` when its TensorBoard row was written} of one run."""
  import glob
  import os
  from tff_algos.training import outputs as run_outputs
  walls = {}
  for path in glob.glob(os.path.join(run_dir, 'tb', 'events.out.tfevents.*')):
    for event in run_outputs._read_events(path):  # pylint: disable=protected-access
      if event.HasField('summary'):
        walls.setdefault(event.step, event.wall_time)
  return walls


def _in_run_ms_per_round(run_dir: str, first: int, last: int) -> float:
  """Milliseconds a round between rounds `first` and `last` of ONE run, from
  the wall times of its TensorBoard rows (taken as each round ends): the
  marginal cost without the start-up of two processes, whose spread (~1 s
  between runs here) swamps a difference of a few hundred rounds."""
  walls = _row_walls(run_dir)
  return 1000 * (walls[last] - walls[first]) / (last - first)


def _trainer_loop_costs(quick: bool) -> dict:
  """(h) the trainer end to end, as a user meets it: the marginal milliseconds of
  a trainer round on the quadratic toy (10 clients, K = 1) from runs of two
  lengths, each less its own seconds from launch to its first round's row
  (`trainer_seconds_to_first_round`: the start-ups' spread swamped the
  difference, which read -0.7 to 5.5 ms in five runs of one session), the
  start-up that the extrapolation to 0 rounds leaves, the same two
  with 10 rounds per TFF call, and how many runs of a 12-configuration grid of
  a small model finish per minute. `..._in_run` keys: the marginal cost inside
  the longer run (`_in_run_ms_per_round`), the finer measure."""
  import os
  import tempfile
  short, long = (100, 400) if quick else (300, 1200)
  toy = ['--task=quadratic', '--local_steps=1', '--clients_per_round=10',
         f'--rounds_per_eval={short}']
  with tempfile.TemporaryDirectory() as root:

    def run_lengths(extra: list[str], name: str) -> tuple[float, float, dict, float]:
      """(marginal s a round, start-up s, {rounds: run seconds}, marginal ms a
      round inside the longer run) of the toy."""
      seconds, to_first = {}, {}
      for n in (short, long):
        seconds[n], launched = _launched_run('experiments.train', toy + extra + [
            f'--total_rounds={n}', f'--experiment_name={name}{n}'], root)
        walls = _row_walls(os.path.join(root, f'{name}{n}'))
        to_first[n] = walls[min(walls)] - launched
      # Each run's own seconds to its first round's row taken out: the two
      # start-ups' spread (~1 s here) no longer lands in the difference, which
      # keeps every per-round cost, the run's end and the process's exit.
      per_round = ((seconds[long] - to_first[long]) - (seconds[short] - to_first[short])) / (
          long - short)
      in_run = _in_run_ms_per_round(os.path.join(root, f'{name}{long}'), short, long)
      return (per_round, seconds[short] - short * per_round,
              {str(n): t for n, t in seconds.items()}, in_run,
              {str(n): t for n, t in to_first.items()})
    per_round, startup, runs, in_run, to_first = run_lengths([], 'toy')
    # The same with 10 rounds per TFF call (`--rounds_per_call`; same models).
    (chained_per_round, chained_startup, chained_runs, chained_in_run,
     chained_to_first) = run_lengths(['--rounds_per_call=10'], 'chained')
    grid = 'client_learning_rate=0.3,0.1,0.03;local_steps=1,2,5,10'
    t_grid = _timed_run('experiments.grid', [
        '--task=digits', '--model=logistic', '--total_rounds=5', '--rounds_per_eval=5',
        '--clients_per_round=5', f'--grid={grid}'], root)
  return dict(trainer_ms_per_round=1000 * per_round, startup_s=startup,
              trainer_ms_per_round_in_run=in_run,
              trainer_ms_per_round_10_per_call=1000 * chained_per_round,
              trainer_ms_per_round_10_per_call_in_run=chained_in_run,
              startup_s_10_per_call=chained_startup,
              grid_runs_per_minute=12 * 60 / t_grid,
              trainer_run_seconds=runs, trainer_run_seconds_10_per_call=chained_runs,
              trainer_seconds_to_first_round=to_first,
              trainer_seconds_to_first_round_10_per_call=chained_to_first,
              grid_seconds=t_grid)


def _print_a_to_f(result: dict) -> None:
  seconds = result['seconds_per_round']
  print(f"our FedAvg {seconds['ours_fedavg']:.3f} s/round; pure-TF floor "
        f"{seconds['pure_tf_floor']:.3f} s; TFF built-in {seconds['tff_builtin']:.3f} s/round")
  print(f"  of which: the same clients' loops in plain TF "
        f"{result['pure_tf_per_client_vs_floor']:.2f}x the floor; our round "
        f"{result['overhead_vs_pure_tf_per_client']:.2f}x those")
  print(f"overhead vs pure TF {result['overhead_vs_pure_tf']:.2f}x (target <= 0.9); "
        f"vs TFF built-in {result['ratio_vs_tff_builtin']:.2f}x (target <= 0.5); "
        f"fixed cost {result['fixed_ms_per_round']:.1f} ms/round (target <= 2)")
  for name, r in result['per_algorithm'].items():
    over = result['per_algorithm_baseline'].get(name)
    print(f'  {name:24s} {r:.2f}x FedAvg' + (
        '' if over is None else f' (over {over}; '
        f"{result['per_algorithm_vs_sgd_fedavg'][name]:.2f}x the SGD FedAvg)"))
  for name, err in result['per_algorithm_not_run'].items():
    print(f'  {name:24s} not run: {err}')
  print('  scaling: ' + ', '.join(f'{m} clients {s:.3f} s' for m, s in result['scaling'].items()))


def main(argv):
  del argv
  unknown = sorted(set(FLAGS.models) - set(timing.MODELS))
  if unknown:
    return common.fail(f'--models: unknown {", ".join(unknown)}; '
                       f'known: {", ".join(timing.MODELS)}')
  # (c) only filters the registry by --algorithms: an unknown name would be
  # dropped in silence, after minutes of benchmarking. (No TensorFlow in the
  # registry: this answers at once.)
  from tff_algos.algorithms import registry  # pylint: disable=g-import-not-at-top
  if registry.unknown(FLAGS.algorithms or (), '--algorithms'):
    return common.fail(registry.unknown(FLAGS.algorithms, '--algorithms'))
  if FLAGS.models_only and not FLAGS.models:
    return common.fail('--models_only needs --models')
  common.quiet_logs()
  import tensorflow as tf

  try:
    runtime_flags.check()
  except ValueError as e:
    return common.fail(e)
  rounds = 4 if FLAGS.quick else 10
  phases, started = {}, time.perf_counter()

  def phase_done(name):  # wall seconds of each part of this run, for --quick's budget
    nonlocal started
    now = time.perf_counter()
    phases[name] = round(now - started, 1)
    started = now
  result = {}

  result['backend'] = runtime_flags.backend() + (
      f' workers={runtime_flags.workers()}' if runtime_flags.workers() else '')
  lanes = runtime_flags.values().get('effective_concurrent_clients')  # in-process only
  if lanes is not None:
    result['concurrent_clients'] = lanes
    result['backend'] += f' concurrent_clients={lanes}'
  result['devices'] = [d.name for d in tf.config.list_logical_devices()]
  with runtime_flags.managed_context() as ctx:
    if not (FLAGS.models_only or FLAGS.trainer_loop_only):
      _measure_round_costs(result, ctx, rounds, phase_done)
    if FLAGS.models:
      result['models'] = {}
      for name in FLAGS.models:  # printed as measured: (g) can take minutes
        m = result['models'][name] = _model_timings(name, rounds, FLAGS.seed)
        print(f"  {name}: our FedAvg {m['seconds_per_round']:.3f} s/round "
              f"({m['rounds_per_second']:.2f} rounds/s); pure-TF floor "
              f"{m['pure_tf_floor_seconds']:.3f} s; overhead {m['overhead_vs_pure_tf']:.2f}x",
              flush=True)
      phase_done('models')
  if FLAGS.trainer_loop_only or (FLAGS.trainer_loop and not FLAGS.models_only):
    result.update(_trainer_loop_costs(FLAGS.quick))
    phase_done('trainer_loop')
  result['phase_seconds'] = phases

  print(f"backend {result['backend']} on {', '.join(result['devices'])}")
  if 'overhead_vs_pure_tf' in result:
    _print_a_to_f(result)
  if 'trainer_ms_per_round' in result:
    print(f"trainer {result['trainer_ms_per_round']:.1f} ms/round (marginal; "
          f"{result['trainer_ms_per_round_in_run']:.1f} inside one run), start-up "
          f"{result['startup_s']:.1f} s; with --rounds_per_call=10 "
          f"{result['trainer_ms_per_round_10_per_call']:.1f} ms/round "
          f"({result['trainer_ms_per_round_10_per_call_in_run']:.1f}), start-up "
          f"{result['startup_s_10_per_call']:.1f} s; grid "
          f"{result['grid_runs_per_minute']:.1f} runs/min")
  print(json.dumps(result))
  return 0


if __name__ == '__main__':
  common.run(main)
