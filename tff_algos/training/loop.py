"""The round loop: sampling, client data, metrics, evaluation, checkpoints.

One loop serves every algorithm and experiment. Everything random is a pure
function of (seed, round): the cohort is drawn from `default_rng([seed, t])`
and each client's examples are shuffled with a seed derived from
(seed, t, slot). Together with the learning process state (which carries the
round-indexed schedules) this makes a run reproducible and makes resuming from
a checkpoint give exactly the model of an uninterrupted run.

Outputs under `<root_output_dir>/<experiment_name>/` (metrics.csv, TensorBoard,
checkpoints, summary.json) are `tff_algos.training.outputs.RunOutputs`'s;
`tff_algos.training.run_dir` guards the directory: one run at a time (a lock), a
manifest that vouches for each checkpoint (checksums, running totals), a resume
from the newest intact checkpoint, and refusals when the directory lost what a
resume needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import tensorflow_federated as tff

from tff_algos import runtime
from tff_algos.core import accounting
from tff_algos.core import client_work
from tff_algos.core import stateful_process
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.errors import UserError
from tff_algos.training import chain
from tff_algos.training import disk
from tff_algos.training import outputs as run_outputs
from tff_algos.training import run_dir
from tff_algos.training import sampling
from tff_algos.training.config import RunConfig  # pylint: disable=unused-import  (training.RunConfig)
from tff_algos.training.evaluation import cached_evaluator, flatten_metrics
from tff_algos.training.initial_weights import initial_model_weights
from tff_algos.training.task import Task

MetricsCSV = run_outputs.MetricsCSV  # metrics.csv's writer
# At most this many client datasets are kept between rounds (a client's
# dataset holds its examples as tensors).
MAX_KEPT_DATASETS = 20_000



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


@contextlib.contextmanager
def _resume_round_said(outputs: run_outputs.RunOutputs) -> Iterator[None]:
  """Inside: a full disk (`disk.NoSpace`) is said with the round that a rerun
  resumes from (`outputs`' last complete checkpoint)."""
  try:
    yield
  except disk.NoSpace as e:
    raise e.resuming_from(outputs.checkpointed) from None


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
  if config.clients_per_round > len(task.client_ids):
    raise RunError(f'clients_per_round={config.clients_per_round} exceeds the '
                   f'{len(task.client_ids)} clients of task {task.name!r}; lower '
                   'clients_per_round')
  evaluate = cached_evaluator(task, config.max_eval_examples)
  outputs = run_outputs.RunOutputs(config.output_dir,
                                   _identity(algorithm, task, config, identity))
  with _resume_round_said(outputs):
    # fwd+bwd FLOPs of the model; measured before the seeded init.
    model_cost = accounting.model_cost(task.model_fn)
    state, initial_client_state = _initial_state(algorithm, task, config, initial_weights)
    try:  # a refused directory closes what was opened (the loop closes it later)
      state, start_round = outputs.resume(state, config.total_rounds)
      # Stateful clients (FedDyn, SCAFFOLD): their states live in a disk-backed
      # store, rolled back to the checkpoint's round on resume.
      if algorithm.stateful_clients:
        outputs.open_store(initial_client_state, task.client_ids, start_round)
      outputs.open_rows(start_round)  # after the last refusal: rows past the checkpoint go
      one_round = _RoundStep(algorithm, task, config, model_cost, outputs)
      loop = _RoundLoop(one_round, evaluate, outputs, config, round_callback)
    except BaseException:
      with contextlib.suppress(Exception):  # the refusal is what to say
        outputs.close()
      raise
    state = loop.run(state, start_round)
    weights = algorithm.process.get_model_weights(state)
    if not loop.last_eval and task.test_data is not None:
      loop.last_eval = evaluate(weights, full=True)
    summary = _summary(algorithm, task, config, model_cost, start_round, loop.wall_s,
                       len(loop.history), loop.last_eval)
    summary['totals'] = outputs.totals  # the whole run, resumed parts included
    last_row = outputs.final_row()
    if last_row:
      summary['final_train'] = run_dir.finite_scalars(last_row)
    summary.update(extra_summary or {})
    outputs.write_summary(summary, weights)
    return RunResult(state=state, model_weights=weights, history=loop.history,
                     final_eval=loop.last_eval, resumed_from=start_round, summary=summary)


def _initial_state(algorithm: FederatedAlgorithm, task: Task, config: RunConfig,
                   initial_weights: Optional[Any]) -> tuple[Any, Any]:
  """(the process's state at round 0, a never-selected client's state)."""
  process = algorithm.process
  stateful = algorithm.stateful_clients
  state = (process.initialize(stateful_process.population_of(
      task, process.needs_mean_examples)) if stateful else process.initialize())
  if algorithm.schedule_values is not None:  # a shared build (`registry.BuildCache`)
    state = client_work.set_schedule_values(state, algorithm.schedule_values)
  if algorithm.server_learning_rate is not None:
    hparams = process.get_hparams(state)
    hparams['finalizer'][tff.learning.optimizers.LEARNING_RATE_KEY] = np.float32(
        algorithm.server_learning_rate)
    state = process.set_hparams(state, hparams)
  state = process.set_model_weights(
      state, initial_weights if initial_weights is not None
      else initial_model_weights(task, config.seed))
  # A never-selected client's state (may depend on the initial model).
  return state, (process.initial_client_state(state) if stateful else None)


class _RoundStep:
  """One round: the cohort, its datasets, the process's step, the row of
  measurements, costs and running totals (not yet evaluations)."""

  def __init__(self, algorithm: FederatedAlgorithm, task: Task, config: RunConfig,
               model_cost: accounting.ModelCost, outputs: run_outputs.RunOutputs):
    self.algorithm, self.task, self.config = algorithm, task, config
    self.model_cost, self.outputs = model_cost, outputs
    self.client_sizes = accounting.ClientSizes()
    self.client_ids = task.client_ids
    # A client's dataset is the same in every round unless its examples are
    # reshuffled or augmented per round; then it is built once and kept.
    self._keep_datasets = task.augment_fn is None and not (
        task.uses_shuffle_seed and config.shuffle == 'rr')
    self._datasets: dict[str, Any] = {}

  def _dataset(self, cid: str, round_num: int):
    """Client `cid`'s dataset for round `round_num`."""
    dataset = self._datasets.get(cid)
    if dataset is None:
      config, task = self.config, self.task
      # The seeds (two generators, ~0.04 ms each) only where the task uses them.
      dataset = task.client_dataset(
          cid, sampling.shuffle_seed(config.shuffle, config.seed, round_num, cid)
          if task.uses_shuffle_seed else None,
          reshuffle_each_epoch=config.shuffle == 'rr',
          augment_seed=sampling.augment_seed(config.seed, round_num, cid)
          if task.augment_fn is not None else None)
      if self._keep_datasets and len(self._datasets) < MAX_KEPT_DATASETS:
        self._datasets[cid] = dataset
    return dataset

  def rounds(self, state, first: int, n: int) -> tuple[Any, list[tuple[dict[str, Any], int, bool]]]:
    """Rounds first..first+n-1 in one TFF call where they can share one
    (`training.chain`: the same models and metrics): (state after them, per round
    (row, cohort size, whether every client was dropped)). Each row's
    round_time_s is the call's time over n."""
    t0 = time.perf_counter()
    store = self.outputs.store
    round_nums = range(first, first + n)  # n = 1 where chains cannot run (`_one_per_call`)
    cohorts = [sampling.draw_cohort(self.client_ids, self.config, r) for r in round_nums]
    data = [[self._dataset(cid, r) for cid in cohort] for r, cohort in zip(round_nums, cohorts)]
    process = self.algorithm.process
    try:
      if store is not None:
        output = process.next(state, data[0], store.gather(cohorts[0]))
        store.scatter(cohorts[0], output.client_states)
        state, metrics = output.state, [output.metrics]
      elif n == 1:
        output = process.next(state, data[0])
        state, metrics = output.state, [output.metrics]
      else:
        state, metrics = chain.chained_next(process, n)(state, data)
    except runtime.WorkerStopped:
      runtime.raise_if_interrupted()  # the signal's KeyboardInterrupt was swallowed
      raise
    rounds = [self._row(r, cohort, round_data, round_metrics) for r, cohort, round_data,
              round_metrics in zip(round_nums, cohorts, data, metrics)]
    seconds = (time.perf_counter() - t0) / n
    for row, _, _ in rounds:
      row['round_time_s'] = seconds
    return state, rounds

  def _row(self, round_num: int, cohort, data, metrics) -> tuple[dict[str, Any], int, bool]:
    """A round's row (all but round_time_s), cohort size and whether every
    client was dropped; adds the round to the running totals."""
    row = {'round': round_num + 1}
    row.update(flatten_metrics(metrics))
    m = len(cohort)
    all_dropped = _all_clients_dropped(row, m)
    traffic = self.algorithm.traffic
    row['cohort_size'] = m  # varies under participation_prob
    row['download_bytes'] = m * traffic.download_bytes
    row['upload_bytes'] = m * traffic.upload_bytes
    row['client_flops'] = accounting.round_client_flops(
        self.algorithm.compute, self.model_cost, row, self.client_sizes, cohort, data)
    self.outputs.cumulative.update(row)
    return row, m, all_dropped


class _RoundLoop:
  """Runs rounds to `config.total_rounds`: evaluations, the callback, outputs,
  checkpoints, the progress bar, the dropped-clients streak, and a stop on
  Ctrl-C or SIGTERM (`Stopped`)."""

  def __init__(self, one_round: _RoundStep, evaluate, outputs: run_outputs.RunOutputs,
               config: RunConfig, round_callback: Optional[RoundCallback]):
    self.one_round, self.evaluate, self.outputs = one_round, evaluate, outputs
    self.config, self.round_callback = config, round_callback
    self.history: list[dict[str, Any]] = []
    self.last_eval: dict[str, float] = {}
    self.bar = None
    self.wall_s = 0.0  # the rounds' wall time
    self.per_call = config.rounds_per_call
    why = _one_per_call(one_round.algorithm, config, round_callback) if self.per_call > 1 else None
    if why:
      run_dir.notice(f'rounds_per_call={self.per_call} runs one round per call here: {why}')
      self.per_call = 1

  def run(self, state, start_round: int):
    config, outputs = self.config, self.outputs
    finished = checkpointed = start_round  # rounds fully written / checkpointed
    try:  # from here on, a stop still closes the outputs
      if start_round:  # before the bar: a line printed after it lands on the bar's line
        print(f'resuming from round {start_round} (checkpoint in {config.output_dir})',
              flush=True)
      if config.progress and start_round < config.total_rounds:
        from tqdm import tqdm  # pylint: disable=g-import-not-at-top
        self.bar = tqdm(total=config.total_rounds, initial=start_round, unit='round',
                        desc=self.one_round.algorithm.name, dynamic_ncols=True)
      dropped_streak = _DroppedStreak(config.max_rounds_all_dropped, _warner(self.bar))
      t_start = time.perf_counter()
      round_num = start_round
      while round_num < config.total_rounds:
        runtime.raise_if_interrupted()  # a SIGINT whose KeyboardInterrupt was swallowed
        # Evaluations, checkpoints and callbacks fall on a call's last round,
        # where `state` is that round's.
        state, results = self.one_round.rounds(state, round_num,
                                               self._rounds_in_call(round_num))
        for row, m, all_dropped in results:
          round_num += 1
          done = round_num
          self._evaluate(state, row, done)
          if self.round_callback is not None:
            self.round_callback(done, state, row)  # may add columns to the row
          self.history.append(row)
          outputs.record(row)
          finished = done
          if done % config.rounds_per_checkpoint == 0 or done == config.total_rounds:
            with run_dir.signals_deferred():  # a stop never cuts a checkpoint short
              if outputs.save(state, done):
                checkpointed = done
          self._show(row)
          dropped_streak.update(done, m, all_dropped)
    except KeyboardInterrupt as e:
      resume = ('' if checkpointed == finished
                else f' (from its checkpoint of round {checkpointed})')
      self._close(quietly=True)
      raise Stopped(f'stopped after round {finished}; rerun the same command to resume'
                    f'{resume}') from e
    except BaseException:
      self._close(quietly=True)  # the run's own error is the one to say
      raise
    self._close()
    self.wall_s = time.perf_counter() - t_start
    return state

  def _rounds_in_call(self, round_num: int) -> int:
    """Rounds from `round_num` on that one TFF call runs: up to
    `rounds_per_call`, ending at the next evaluation, checkpoint (when there
    is an output directory) or last round."""
    config = self.config
    if self.per_call == 1:
      return 1
    n = min(self.per_call, config.total_rounds - round_num)
    if self.outputs.state_manager is not None:
      n = min(n, config.rounds_per_checkpoint - round_num % config.rounds_per_checkpoint)
    if config.rounds_per_eval:
      n = min(n, config.rounds_per_eval - round_num % config.rounds_per_eval)
    return n

  def _evaluate(self, state, row: dict[str, Any], done: int) -> None:
    config = self.config
    if (config.rounds_per_eval and done % config.rounds_per_eval == 0) or \
        done == config.total_rounds:
      self.last_eval = self.evaluate(self.one_round.algorithm.process.get_model_weights(
          state), full=done == config.total_rounds)
      row.update({f'eval/{k}': v for k, v in self.last_eval.items()})

  def _show(self, row: dict[str, Any]) -> None:
    if self.bar is None:
      return
    self.bar.update(1)
    post = {'loss': row.get('client_work/train/loss')}
    if self.last_eval:
      post.update({k: v for k, v in list(self.last_eval.items())[:2]})
    self.bar.set_postfix({k: f'{v:.4g}' for k, v in post.items() if v is not None})

  def _close(self, quietly: bool = False) -> None:
    """Closes the bar and the outputs; `quietly`: a failure to close (the
    disk still full) is dropped, as the run is already ending with an error."""
    try:
      if self.bar is not None:
        self.bar.close()
    except (OSError, ValueError):  # its stream is a closed pipe (`2>&1 | head`)
      pass
    try:
      self.outputs.close()
    except Exception:  # pylint: disable=broad-except
      if not quietly:
        raise


def _summary(algorithm: FederatedAlgorithm, task: Task, config: RunConfig,
             model_cost: accounting.ModelCost, start_round: int, wall: float,
             rounds_run: int, final_eval: dict[str, float]) -> dict[str, Any]:
  """summary.json's description of the run (totals and final rows added by the caller)."""
  traffic = algorithm.traffic
  return dict(algorithm=algorithm.name, task=task.name,
              rounds=config.total_rounds, resumed_from=start_round,
              clients_per_round=config.clients_per_round, seed=config.seed,
              wall_time_s=wall,
              seconds_per_round=wall / max(1, rounds_run),
              download_bytes_per_client=traffic.download_bytes,
              upload_bytes_per_client=traffic.upload_bytes,
              model_bytes=traffic.model_bytes,
              fwd_bwd_flops_per_example=model_cost.fwd_bwd_flops_per_example,
              num_params=model_cost.num_params,
              final_eval=final_eval, task_info=task.info)


def _one_per_call(algorithm: FederatedAlgorithm, config: RunConfig,
                  round_callback: Optional[RoundCallback]) -> Optional[str]:
  """Why this run's rounds cannot share TFF calls (`training.chain`), or None."""
  if round_callback is not None:
    return 'a round callback sees every round'
  if algorithm.stateful_clients:  # the store is read and written between rounds
    return f"{algorithm.name}'s clients keep states"
  if not chain.can_chain(algorithm.process):
    return f"{algorithm.name}'s process cannot be chained"
  if not chain.context_runs_chains():
    return 'several workers merge one aggregation per call'
  if config.participation_prob is not None and config.participation_prob < 1:
    # Cohorts of several sizes are not one CLIENTS placement.
    return 'participation_prob draws cohorts of several sizes'
  return None


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


def _identity(algorithm, task, config, extra) -> dict[str, Any]:
  ident = dict(algorithm=algorithm.name, task=task.name, task_info=task.info,
               clients_per_round=config.clients_per_round, seed=config.seed,
               shuffle=config.shuffle, traffic=dataclasses.asdict(algorithm.traffic))
  if config.participation_prob is not None:
    ident['participation_prob'] = config.participation_prob
  ident.update(extra or {})
  return json.loads(json.dumps(ident, sort_keys=True, default=str))


read_metrics = run_dir.read_metrics  # where the binaries and tables found it
