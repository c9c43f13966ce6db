"""The round loop: sampling, client data, metrics, evaluation, checkpoints.

One loop serves every algorithm and experiment. Everything random is a pure
function of (seed, round): the cohort is drawn from `default_rng([seed, t])`
and each client's examples are shuffled with a seed derived from
(seed, t, slot). Together with the learning process state (which carries the
round-indexed schedules) this makes a run reproducible and makes resuming from
a checkpoint give exactly the model of an uninterrupted run.

Outputs under `<root_output_dir>/<experiment_name>/` (TFF program tooling):
`metrics.csv` (one row per round; a resumed run first drops the rows after its
checkpoint, then appends: TFF's `CSVFileReleaseManager` does the same but
rewrites the whole file on every release, quadratic in the rounds), TensorBoard
events (`tff.program.TensorBoardReleaseManager`; rewritten from metrics.csv when a
resume dropped rows, so no round appears twice), `checkpoints/`
(`tff.program.FileProgramStateManager`) and `summary.json`. `tff_algos.run_dir`
guards the directory: one run at a time (a lock), a manifest that vouches for
each checkpoint (checksums, running totals), a resume from the newest intact
checkpoint, and refusals when the directory lost what a resume needs.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.base import Task
from tff_algos import run_dir
from tff_algos.errors import UserError
from tff_algos import runtime
from tff_algos.core import accounting
from tff_algos.core import client_state
from tff_algos.core import crash_points
from tff_algos.core import local_training
from tff_algos.core import stateful_process
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.errors import UserError


@dataclasses.dataclass(frozen=True)
class RunConfig:
  total_rounds: int
  clients_per_round: int
  seed: int = 0
  rounds_per_eval: int = 10          # 0: evaluate only at the end
  rounds_per_checkpoint: int = 10
  output_dir: Optional[str] = None   # None: keep nothing on disk
  progress: bool = True
  # How a client's examples are ordered each round: 'rr' a fresh permutation
  # every round (random reshuffling), 'so' one permutation per client for the
  # whole run (shuffle-once), 'none' the dataset's own order.
  shuffle: str = 'rr'
  # Periodic evaluations use the first N test examples (fixed across rounds;
  # the final evaluation always uses the whole test set). None: all.
  max_eval_examples: Optional[int] = None
  # Discard the outputs already in `output_dir` and start over at round 0.
  restart: bool = False
  # Stop (with a UserError) after this many consecutive rounds in which every
  # client diverged and was dropped (the model cannot move). 0: never stop.
  max_rounds_all_dropped: int = 10
  # None: `clients_per_round` clients drawn uniformly each round. A float p:
  # each client joins independently with probability p, the whole draw
  # repeated while nobody joins (the participation of paper 003's code).
  participation_prob: Optional[float] = None

  def __post_init__(self):
    if self.total_rounds < 1:
      raise ValueError(f'total_rounds must be >= 1, got {self.total_rounds}')
    if self.seed < 0:
      raise ValueError(f'seed must be >= 0, got {self.seed}')
    if self.clients_per_round < 1:
      raise ValueError(f'clients_per_round must be >= 1, got {self.clients_per_round}')
    if self.rounds_per_eval < 0 or self.rounds_per_checkpoint < 1:
      raise ValueError('rounds_per_eval must be >= 0 and rounds_per_checkpoint >= 1')
    if self.max_eval_examples is not None and self.max_eval_examples < 1:
      raise ValueError('max_eval_examples must be >= 1')
    if self.participation_prob is not None and not 0 < self.participation_prob <= 1:
      raise ValueError(f'participation_prob must be in (0, 1], got {self.participation_prob}')
    if self.shuffle not in ('rr', 'so', 'none'):
      raise ValueError(f"shuffle must be 'rr', 'so' or 'none', got {self.shuffle!r}")
    if self.max_rounds_all_dropped < 0:
      raise ValueError(f'max_rounds_all_dropped must be >= 0 (0: never stop), got '
                       f'{self.max_rounds_all_dropped}')


class RunError(UserError, ValueError):
  """The run cannot go on as asked (its directory holds another run, every
  client keeps diverging, ...); the message says what to change."""


class Stopped(KeyboardInterrupt):
  """Ctrl-C or SIGTERM stopped `run_training`; str() says after which round
  and that the same command resumes the run."""


@dataclasses.dataclass
class RunResult:
  state: Any
  model_weights: Any
  history: list[dict[str, Any]]      # one row per round run in this call
  final_eval: dict[str, float]
  resumed_from: int                  # 0: fresh start
  summary: dict[str, Any]


def sample_clients(client_ids: list[str], clients_per_round: int, seed: int,
                   round_num: int) -> list[str]:
  """Uniformly without replacement within the round; fresh every round."""
  if clients_per_round > len(client_ids):
    raise ValueError(f'clients_per_round={clients_per_round} exceeds the '
                     f'{len(client_ids)} clients of the task')
  rng = np.random.default_rng([seed, round_num])
  return [client_ids[i] for i in rng.choice(len(client_ids), clients_per_round,
                                            replace=False)]


def sample_participants(client_ids: list[str], prob: float, seed: int,
                        round_num: int) -> list[str]:
  """Each client joins with probability `prob`; redrawn while none joins."""
  rng = np.random.default_rng([seed, round_num, 3])
  while True:
    joined = np.flatnonzero(rng.random(len(client_ids)) < prob)
    if joined.size:
      return [client_ids[i] for i in joined]


def draw_cohort(client_ids: list[str], config: RunConfig, round_num: int) -> list[str]:
  """The round's cohort under `config`'s participation scheme."""
  if config.participation_prob is None:
    return sample_clients(client_ids, config.clients_per_round, config.seed, round_num)
  return sample_participants(client_ids, config.participation_prob, config.seed,
                             round_num)


def shuffle_seed(mode: str, seed: int, round_num: int, client_id: str) -> Optional[int]:
  """Seed of a client's example order in a round (None: no shuffling).

  'rr': a function of (seed, round, client); 'so': of (seed, client) only, so
  the same permutation is used in every round, across resumes too.
  """
  if mode == 'none':
    return None
  cid = zlib.crc32(client_id.encode())
  key = [seed, cid, 2] if mode == 'so' else [seed, round_num, cid, 1]
  return int(np.random.default_rng(key).integers(2**31 - 1))


def augment_seed(seed: int, round_num: int, client_id: str) -> int:
  """Seed of a client's data augmentation in a round (whatever the shuffle mode)."""
  cid = zlib.crc32(client_id.encode())
  return int(np.random.default_rng([seed, round_num, cid, 3]).integers(2**31 - 1))


def flatten_metrics(metrics, prefix: str = '') -> dict[str, Any]:
  """Nested measurements -> {'a/b/c': python scalar}."""
  if hasattr(metrics, '_asdict'):
    metrics = metrics._asdict()
  if isinstance(metrics, Mapping):
    out = {}
    for key, value in metrics.items():
      out.update(flatten_metrics(value, f'{prefix}{key}/'))
    return out
  value = np.asarray(metrics)
  return {prefix[:-1]: value.item() if value.size == 1 else value.tolist()}


def build_evaluator(task: Task, max_examples: Optional[int] = None
                    ) -> Callable[..., dict[str, float]]:
  """Centralised evaluation of model weights on `task.test_data` (plain TF).

  The returned `run(weights, full=False)` uses the first `max_examples` test
  examples unless `full` (a fixed sample, so curves are comparable).
  """
  if task.test_data is None:
    return lambda weights, full=False: {}
  model = task.model_fn()
  sample = task.test_data
  if max_examples is not None:
    batch = next(iter(tf.nest.flatten(task.test_data.element_spec))).shape[0]
    sample = task.test_data.unbatch().take(max_examples).batch(batch or 100)

  def evaluate_on(dataset):
    @tf.function
    def evaluate(weights):
      local_training.assign_weights(model, weights)
      model.reset_metrics()
      for batch in dataset:
        model.forward_pass(batch, training=False)
      return model.report_local_unfinalized_metrics()
    return evaluate

  evaluators = {False: evaluate_on(sample), True: evaluate_on(task.test_data)}

  def run(weights, full: bool = False) -> dict[str, float]:
    unfinalized = evaluators[full](weights)
    # Keras finalizers are tf.functions that build a metric on each trace;
    # run their Python bodies eagerly instead.
    finalizers = model.metric_finalizers()
    return {name: float(np.asarray(
        getattr(finalizers[name], 'python_function', finalizers[name])(value)))
            for name, value in unfinalized.items()}

  return run


class MetricsCSV:
  """Append-only per-round CSV keyed by 'round', truncated once on resume."""

  def __init__(self, path: str, resume_round: int):
    self.path = path
    self.fields: list[str] = []
    self.dropped_rows = False  # rows past `resume_round` were removed
    rows = []
    if os.path.exists(path):
      self.fields, all_rows = run_dir.read_metrics_csv(path)  # UserError: a bad line
      rows = [r for r in all_rows if float(r['round']) <= resume_round]
      self.dropped_rows = len(rows) < len(all_rows)
      self._rewrite(rows)  # also mends a last line cut short by a crash
    self.kept_rows = [{k: _parse_cell(v) for k, v in r.items() if v != ''} for r in rows]

  def _rewrite(self, rows):
    tmp = self.path + '.tmp'
    with open(tmp, 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=self.fields)
      writer.writeheader()
      writer.writerows(rows)
    os.replace(tmp, self.path)

  def append(self, row: dict[str, Any]):
    new = [k for k in row if k not in self.fields]
    if new or not os.path.exists(self.path):
      rows = []
      if os.path.exists(self.path):
        with open(self.path, newline='') as f:
          rows = list(csv.DictReader(f))
      self.fields += new
      self._rewrite(rows)
    with open(self.path, 'a', newline='') as f:
      csv.DictWriter(f, fieldnames=self.fields).writerow(row)


def _tensorboard(tb_dir: str, dropped_rows: bool,
                 kept_rows: list[dict[str, Any]]) -> tff.program.TensorBoardReleaseManager:
  """The run's TensorBoard log, without rounds that the run will repeat.

  A resumed run repeats the rounds after its checkpoint; their first values
  are already in the event files (written after their CSV rows), and
  TensorBoard would show both. When `MetricsCSV` dropped such rows, the log is
  rewritten from the rows it kept (their wall times become the resume's).
  """
  if dropped_rows and os.path.isdir(tb_dir):
    shutil.rmtree(tb_dir)
    manager = tff.program.TensorBoardReleaseManager(tb_dir)
    asyncio.run(_release_rows(manager, kept_rows))
    return manager
  return tff.program.TensorBoardReleaseManager(tb_dir)


async def _release_rows(manager, rows):
  for row in rows:
    await manager.release({k: v for k, v in row.items()
                           if k != 'round' and isinstance(v, float)}, key=int(row['round']))


def _parse_cell(value: str):
  try:
    return float(value)
  except ValueError:
    return value


def initial_model_weights(task: Task, seed: int) -> tff.learning.models.ModelWeights:
  """The model's initial weights, drawn after seeding TF, numpy and Python.

  (`tf.random.set_seed` alone does not make unseeded Keras initialisers repeat
  within a process; `tf.keras.utils.set_random_seed` does.)
  """
  tf.keras.utils.set_random_seed(seed)
  model = task.model_fn()
  return tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_variables],
      non_trainable=[v.numpy() for v in model.non_trainable_variables])


RoundCallback = Callable[[int, Any, dict], None]


def run_training(algorithm: FederatedAlgorithm, task: Task, config: RunConfig,
                 extra_summary: Optional[dict[str, Any]] = None,
                 round_callback: Optional[RoundCallback] = None,
                 initial_weights: Optional[Any] = None,
                 identity: Optional[dict[str, Any]] = None) -> RunResult:
  """Runs (or resumes) `config.total_rounds` rounds of `algorithm` on `task`.

  Holds `config.output_dir`'s run lock throughout (another run there is
  refused); `config.restart` first removes the directory's earlier outputs.
  See `_run_training` for the arguments.
  """
  with run_dir.lock(config.output_dir):
    if config.output_dir and config.restart:
      run_dir.clear(config.output_dir)
    return _run_training(algorithm, task, config, extra_summary, round_callback,
                         initial_weights, identity)


def _run_training(algorithm: FederatedAlgorithm, task: Task, config: RunConfig,
                  extra_summary: Optional[dict[str, Any]] = None,
                  round_callback: Optional[RoundCallback] = None,
                  initial_weights: Optional[Any] = None,
                  identity: Optional[dict[str, Any]] = None) -> RunResult:
  """The round loop of `run_training`, under the run lock.

  `round_callback(round_done, state, row)` is called after every round, before
  the row is written, so it may add columns (e.g. the model trajectory);
  `initial_weights` replaces the seeded default
  initialisation of a fresh run. `identity` (e.g. the flag values) is stored
  with the run, together with the algorithm, task and sampling settings; a
  resume whose identity differs is refused instead of continuing someone
  else's run.
  """
  runtime.raise_if_interrupted()  # e.g. a sweep's next run after a Ctrl-C
  process = algorithm.process
  client_ids = task.client_ids
  if config.clients_per_round > len(client_ids):
    raise RunError(f'clients_per_round={config.clients_per_round} exceeds the '
                   f'{len(client_ids)} clients of task {task.name!r}; lower '
                   'clients_per_round')
  evaluate = build_evaluator(task, config.max_eval_examples)
  out_dir = config.output_dir
  state_manager = csv_writer = tb_manager = None
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    state_manager = tff.program.FileProgramStateManager(
        os.path.join(out_dir, 'checkpoints'), prefix='round_', keep_total=2,
        keep_first=False)

  run_identity = _identity(algorithm, task, config, identity)
  if out_dir:
    _check_identity(os.path.join(out_dir, 'run_identity.json'), run_identity)
  # fwd+bwd FLOPs of the model (issue 6); measured before the seeded init.
  model_cost = accounting.model_cost(task.model_fn)
  client_sizes = accounting.ClientSizes()
  stateful = algorithm.stateful_clients
  state = (process.initialize(stateful_process.population_of(
      task, process.needs_mean_examples)) if stateful else process.initialize())
  state = process.set_model_weights(
      state, initial_weights if initial_weights is not None
      else initial_model_weights(task, config.seed))
  # A never-selected client's state (may depend on the initial model).
  initial_client_state = process.initial_client_state(state) if stateful else None
  start_round, manifest, resumed = 0, None, None
  if state_manager is not None:
    manifest = run_dir.Manifest(out_dir)
    state, start_round = _resume_point(state_manager, manifest, state, config)
    resumed = manifest.entries.get(start_round)  # None: fresh, or an older run dir
  kept_rows = []  # metrics.csv's rows up to the checkpoint, parsed
  if out_dir:
    csv_writer = MetricsCSV(os.path.join(out_dir, 'metrics.csv'), start_round)
    kept_rows = csv_writer.kept_rows
    tb_manager = _tensorboard(os.path.join(out_dir, 'tb'), csv_writer.dropped_rows,
                              kept_rows)
  # Running totals of bytes and client FLOPs (issue 6) and summary.json's:
  # from the checkpoint's manifest entry (metrics.csv may have lost rows), else
  # from the rows kept in metrics.csv.
  cumulative = accounting.CumulativeCost(() if resumed else kept_rows)
  run_totals = run_dir.summary_totals(() if resumed else kept_rows)
  if resumed:
    cumulative.totals.update(resumed['cumulative'])
    run_totals.update(resumed['totals'])
    _note_lost_rows(csv_writer.path, kept_rows, start_round)

  # Stateful clients (FedDyn, SCAFFOLD): their states live in a disk-backed
  # store, rolled back to the checkpoint's round on resume.
  store = _client_state_store(initial_client_state, task, out_dir, start_round,
                              (resumed or {}).get('store')) if stateful else None

  traffic = algorithm.traffic
  history: list[dict[str, Any]] = []
  last_eval: dict[str, float] = {}
  rounds = range(start_round, config.total_rounds)
  bar = None
  if config.progress and len(rounds):
    from tqdm import tqdm
    bar = tqdm(total=config.total_rounds, initial=start_round, unit='round',
               desc=algorithm.name, dynamic_ncols=True)
  if start_round:
    print(f'resuming from round {start_round} (checkpoint in {out_dir})', flush=True)
  t_start = time.perf_counter()
  finished = checkpointed = start_round  # rounds fully written / checkpointed
  dropped_streak = _DroppedStreak(config.max_rounds_all_dropped, _warner(bar))
  try:
    for round_num in rounds:
      runtime.raise_if_interrupted()  # a SIGINT whose KeyboardInterrupt was swallowed
      t0 = time.perf_counter()
      cohort = draw_cohort(client_ids, config, round_num)
      data = [task.client_dataset(
          cid, shuffle_seed(config.shuffle, config.seed, round_num, cid),
          reshuffle_each_epoch=config.shuffle == 'rr',
          augment_seed=augment_seed(config.seed, round_num, cid)) for cid in cohort]
      try:
        if store is None:
          output = process.next(state, data)
        else:
          output = process.next(state, data, store.gather(cohort))
          store.scatter(cohort, output.client_states)
      except runtime.WorkerStopped:
        runtime.raise_if_interrupted()  # the signal's KeyboardInterrupt was swallowed
        raise
      state = output.state
      row = {'round': round_num + 1}
      row.update(flatten_metrics(output.metrics))
      m = len(cohort)
      all_dropped = _all_clients_dropped(row, m)
      row['download_bytes'] = m * traffic.download_bytes
      row['upload_bytes'] = m * traffic.upload_bytes
      row['client_flops'] = accounting.round_client_flops(
          algorithm.compute, model_cost, row, client_sizes, cohort, data)
      cumulative.update(row)
      row['round_time_s'] = time.perf_counter() - t0
      done = round_num + 1
      if (config.rounds_per_eval and done % config.rounds_per_eval == 0) or \
          done == config.total_rounds:
        last_eval = evaluate(process.get_model_weights(state),
                             full=done == config.total_rounds)
        row.update({f'eval/{k}': v for k, v in last_eval.items()})
      if round_callback is not None:
        round_callback(done, state, row)  # may add columns to the row
      history.append(row)
      run_dir.add_to_totals(run_totals, row)
      if csv_writer is not None:
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float))}
        csv_writer.append(scalars)
        crash_points.reached('metrics_row')
        asyncio.run(tb_manager.release(
            {k: v for k, v in scalars.items() if k != 'round'}, key=done))
      if state_manager is not None and (
          done % config.rounds_per_checkpoint == 0 or done == config.total_rounds):
        _checkpoint(state_manager, manifest, store, state, done, dict(
            cumulative=dict(cumulative.totals), totals=dict(run_totals),
            row=run_dir.finite_scalars(row)))
        checkpointed = done
      if bar is not None:
        bar.update(1)
        post = {'loss': row.get('client_work/train/loss')}
        if last_eval:
          post.update({k: v for k, v in list(last_eval.items())[:2]})
        bar.set_postfix({k: f'{v:.4g}' for k, v in post.items() if v is not None})
      finished = done
      dropped_streak.update(done, m, all_dropped)
  except KeyboardInterrupt as e:
    resume = ('' if checkpointed == finished
              else f' (from its checkpoint of round {checkpointed})')
    raise Stopped(f'stopped after round {finished}; rerun the same command to resume'
                  f'{resume}') from e
  finally:
    if bar is not None:
      bar.close()
    if store is not None:
      store.close()
      if not out_dir:
        shutil.rmtree(store.directory, ignore_errors=True)
  wall = time.perf_counter() - t_start

  weights = process.get_model_weights(state)
  if not last_eval and task.test_data is not None:
    last_eval = evaluate(weights, full=True)
  summary = dict(algorithm=algorithm.name, task=task.name,
                 rounds=config.total_rounds, resumed_from=start_round,
                 clients_per_round=config.clients_per_round, seed=config.seed,
                 wall_time_s=wall,
                 seconds_per_round=wall / max(1, len(history)),
                 download_bytes_per_client=traffic.download_bytes,
                 upload_bytes_per_client=traffic.upload_bytes,
                 model_bytes=traffic.model_bytes,
                 fwd_bwd_flops_per_example=model_cost.fwd_bwd_flops_per_example,
                 num_params=model_cost.num_params,
                 final_eval=last_eval, task_info=task.info)
  summary['totals'] = run_totals  # the whole run, resumed parts included
  last_row = history[-1] if history else (resumed or {}).get('row') or (
      kept_rows[-1] if kept_rows else None)
  if last_row:
    summary['final_train'] = run_dir.finite_scalars(last_row)
  summary.update(extra_summary or {})
  if out_dir:
    with open(os.path.join(out_dir, 'summary.json'), 'w') as f:
      json.dump(summary, f, indent=2, default=str)
    np.savez(os.path.join(out_dir, 'final_weights.npz'),
             *[np.asarray(w) for w in weights.trainable])
  return RunResult(state=state, model_weights=weights, history=history,
                   final_eval=last_eval, resumed_from=start_round, summary=summary)


def _resume_point(state_manager, manifest: run_dir.Manifest, state,
                  config: RunConfig) -> tuple[Any, int]:
  """(state, round) to start from: the newest intact checkpoint, else round 0."""
  versions = asyncio.run(state_manager.get_versions()) or []
  loaded, start_round = run_dir.select_checkpoint(
      config.output_dir, versions, manifest,
      lambda version: asyncio.run(state_manager.load(version, state)))
  if start_round > config.total_rounds:
    raise UserError(f'{config.output_dir} holds a run checkpointed at round '
                    f'{start_round}, past --total_rounds={config.total_rounds}; '
                    f'raise --total_rounds, or {run_dir.RESTART_FIX}')
  return (state if loaded is None else loaded), start_round


def _checkpoint(state_manager, manifest: run_dir.Manifest, store, state, done: int,
                entry: dict[str, Any]) -> None:
  """Checkpoints round `done`: the client store, the server state, then the
  manifest entry that vouches for both (a crash in between resumes from the
  previous checkpoint)."""
  if store is not None:
    entry['store'] = store.checkpoint(done)
  crash_points.reached('checkpoint_state')
  asyncio.run(state_manager.save(state, done))
  crash_points.reached('checkpoint_manifest')
  manifest.record(done, entry, asyncio.run(state_manager.get_versions()) or [])


def _note_lost_rows(path: str, kept_rows, start_round: int) -> None:
  have = {int(r['round']) for r in kept_rows}
  lost = [r for r in range(1, start_round + 1) if r not in have]
  if lost:
    run_dir.notice(f'{path} lacks {len(lost)} of rounds 1-{start_round} (first: round '
                   f'{lost[0]}); resuming from round {start_round}, totals kept from '
                   'the checkpoint')


def _all_clients_dropped(row: dict[str, Any], cohort_size: int) -> bool:
  """True when every client of the round diverged (non-finite update) and was
  dropped; its training metrics (loss, accuracy), averaged over no client,
  become NaN instead of 0. Counts (num_examples, num_batches) stay 0."""
  dropped = [v for k, v in row.items() if k.endswith('non_finite_clients')]
  if not dropped or dropped[0] < cohort_size:
    return False
  for key in row:
    if '/train/' in key and not key.endswith(('/num_examples', '/num_batches')):
      row[key] = float('nan')
  return True


def _warner(bar) -> Callable[[str], None]:
  """Prints a warning line to stderr, above the progress bar if there is one."""
  if bar is None:
    return lambda text: print(text, file=sys.stderr, flush=True)
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return lambda text: tqdm.write(text, file=sys.stderr)


class _DroppedStreak:
  """Warns on each round in which every client was dropped; after
  `max_rounds` such rounds in a row raises `RunError` (0: never)."""

  def __init__(self, max_rounds: int, write: Callable[[str], None]):
    self.max_rounds, self.write, self.rounds = max_rounds, write, 0

  def update(self, round_done: int, cohort_size: int, all_dropped: bool):
    if not all_dropped:
      self.rounds = 0
      return
    self.rounds += 1
    self.write(f'warning: round {round_done}: all {cohort_size} clients diverged '
               '(non-finite update) and were dropped; the model did not change')
    if self.max_rounds and self.rounds >= self.max_rounds:
      raise RunError(
          f'every client diverged in each of the last {self.rounds} rounds (up to round '
          f'{round_done}), so the model cannot train; lower --client_learning_rate or '
          '--local_steps (or raise --max_rounds_all_dropped; 0 never stops)')


def _client_state_store(initial_state, task: Task, out_dir: Optional[str],
                        start_round: int, fingerprint: Optional[int] = None
                        ) -> client_state.ClientStateStore:
  """The run's client-state store at round `start_round` (temporary without
  an output directory), checked against the checkpoint's `fingerprint`."""
  directory = (os.path.join(out_dir, 'client_state') if out_dir
               else tempfile.mkdtemp(prefix='client_state_'))
  store = client_state.ClientStateStore(directory, task.client_ids, initial_state)
  if start_round == 0:
    store.reset()
  else:
    store.restore(start_round)
    if fingerprint is not None and store.fingerprint() != fingerprint:
      store.close()
      raise UserError(f'{directory} does not match the checkpoint of round '
                      f'{start_round} (its bitmap or checksums were changed); restore '
                      f'it from a backup, or {run_dir.RESTART_FIX}')
  return store


def _identity(algorithm, task, config, extra) -> dict[str, Any]:
  ident = dict(algorithm=algorithm.name, task=task.name, task_info=task.info,
               clients_per_round=config.clients_per_round, seed=config.seed,
               shuffle=config.shuffle, traffic=dataclasses.asdict(algorithm.traffic))
  if config.participation_prob is not None:
    ident['participation_prob'] = config.participation_prob
  ident.update(extra or {})
  return json.loads(json.dumps(ident, sort_keys=True, default=str))


def _check_identity(path: str, ident: dict[str, Any]) -> None:
  if os.path.exists(path):
    with open(path) as f:
      stored = json.load(f)
    diff = sorted(k for k in set(stored) | set(ident) if stored.get(k) != ident.get(k))
    if diff:
      raise UserError(
          f'{os.path.dirname(path)} holds a different run (differs in: '
          f'{", ".join(diff)}); choose another --experiment_name, or '
          f'{run_dir.RESTART_FIX}')
  else:
    with open(path, 'w') as f:
      json.dump(ident, f, indent=2, sort_keys=True)


def read_metrics(path: str) -> list[dict[str, Any]]:
  """Rows of a metrics.csv: numbers as floats, empty cells left out."""
  def parse(v):
    try:
      return float(v)
    except ValueError:
      return v
  with open(path, newline='') as f:
    return [{k: parse(v) for k, v in row.items() if v not in ('', None)}
            for row in csv.DictReader(f)]
