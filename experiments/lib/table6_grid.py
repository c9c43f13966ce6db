"""The grid of paper 003's Table 6 as stacked-lane runs, and what it measures.

Each (method, local-work shape) is ONE algorithm built by the library's own
builder, with the learning rate and the method's constant (FedDyn alpha,
FedProx mu) given as `Lanes`: the grid's configurations of that shape train
side by side in one stacked logistic model (`tasks.stacked_logistic`). The
local-work shape is E epochs (FedDyn, FedAvg, FedProx) or K steps (SCAFFOLD),
a trace-time constant of the client loop.

The scored model is the paper's (App. A.2: "the average model from all devices
in each communication round"; the authors' `all_model`): every algorithm is
built with `report_device_average`, so `process.get_model_weights(state)` is
the average of all m device models (a device holds its model from its last
round, the initial one before), the plain mean for FedDyn and SCAFFOLD and the
n_k-weighted mean for FedAvg and FedProx, as the authors' code
(`core.device_average`). The server model (`process.server_model(state)`) is
scored too, as a secondary search (`Search.server`).

Search with early stopping: within a method, a configuration's count is its
first round at the target times a constant, so the best configuration is the
one that reaches the target first. Shapes run one after another, each at most
until the round at which an earlier one reached every target (of both scored
models), and a run stops once every target of both has been reached.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Optional, Sequence

import numpy as np
from scipy import optimize

from experiments.lib import runtime_flags
from tasks import feddyn_data
from tasks import stacked_logistic
from tasks.registry import TaskOptions
from tff_algos import training
from tff_algos.algorithms import fedopt, fedprox, feddyn, scaffold
from tff_algos.core import local_training
from tff_algos.core.lanes import Lanes

DIM, CLASSES = feddyn_data.SYNTHETIC_DIM, feddyn_data.SYNTHETIC_CLASSES
METHODS = ('feddyn', 'scaffold', 'fedavg', 'fedprox')


@dataclasses.dataclass(frozen=True)
class Grid:
  """App. A.1's search space."""
  learning_rates: tuple = (1.0, 0.1)
  epochs: tuple = (1, 10, 50)
  alphas: tuple = (0.1, 0.01, 0.001)          # FedDyn
  scaffold_steps: tuple = (20, 200, 1000)     # SCAFFOLD K (= 20 E at 200 points, B = 10)
  mus: tuple = (0.01, 1e-4)                   # FedProx
  weight_decay: float = 1e-5
  clip_norm: Optional[float] = 10.0           # reference code (max_norm = 10)
  batch_size: int = 10

  def shapes(self, method: str) -> tuple:
    return self.scaffold_steps if method == 'scaffold' else self.epochs

  def lanes(self, method: str) -> list[dict]:
    """The configurations sharing one shape: dicts of lr (+ alpha or mu)."""
    extra = {'feddyn': ('alpha', self.alphas), 'fedprox': ('mu', self.mus)}.get(method)
    if extra is None:
      return [dict(lr=lr) for lr in self.learning_rates]
    name, values = extra
    return [dict(lr=lr, **{name: v})
            for lr, v in itertools.product(self.learning_rates, values)]


def build(method: str, shape: int, grid: Grid, model_fn, data_groups: int = 1):
  """The method's library algorithm, every hyperparameter of its lanes a `Lanes`
  (the grid's configurations, once per data group: lane g * C + c), reporting
  the average of all device models (`report_device_average`: plain for FedDyn
  and SCAFFOLD, n_k-weighted for FedAvg and FedProx, the library's weighting
  after the authors' code)."""
  lanes = grid.lanes(method) * data_groups
  lr = Lanes([c['lr'] for c in lanes])
  clip = None if grid.clip_norm is None else Lanes([grid.clip_norm] * len(lanes))
  reg = dict(client_weight_decay=grid.weight_decay, clip_norm=clip,
             report_device_average=True)
  if method == 'feddyn':
    return feddyn.build_feddyn(model_fn, feddyn.FedDynConfig(
        alpha=Lanes([c['alpha'] for c in lanes]), client_learning_rate=lr,
        client_epochs_per_round=shape, **reg))
  if method == 'scaffold':
    return scaffold.build_scaffold(model_fn, scaffold.ScaffoldConfig(
        client_learning_rate=lr, local_steps=shape, **reg))
  if method == 'fedavg':
    return fedopt.build_fedavg(model_fn, fedopt.FedAvgConfig(
        client_learning_rate=lr, client_epochs_per_round=shape, **reg), name='fedavg')
  return fedprox.build_fedprox(model_fn, fedprox.FedProxConfig(
      mu=Lanes([c['mu'] for c in lanes]), client_learning_rate=lr,
      client_epochs_per_round=shape, **reg))


def models_per_round(algorithm) -> int:
  """Model-sized vectors a client receives per round (1, SCAFFOLD 2): the
  broadcast's bytes over the model's, hyperparameter scalars not counted."""
  return int(round(algorithm.traffic.download_bytes / algorithm.traffic.model_bytes))


# ------------------------------------------------------------------ the optimum


def _objective(params, x, y, weight_decay):
  """Mean cross-entropy + weight_decay/2 |params|^2 and its gradient (float64)."""
  kernel = params[:DIM * CLASSES].reshape(DIM, CLASSES)
  logits = x @ kernel + params[DIM * CLASSES:]
  top = logits.max(axis=1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
  ce = float((log_z - logits[np.arange(len(y)), y]).mean())
  p = np.exp(logits - log_z[:, None])
  p[np.arange(len(y)), y] -= 1.0
  p /= len(y)
  grad = np.concatenate([(x.T @ p).ravel(), p.sum(axis=0)]) + weight_decay * params
  return ce + 0.5 * weight_decay * float(params @ params), grad, ce


def optimal_loss(x: np.ndarray, y: np.ndarray, weight_decay: float) -> dict:
  """The minimiser of the training objective (L-BFGS to |grad| <= 1e-9): its
  cross-entropy over all devices' data and its objective value."""
  x = x.astype(np.float64)
  result = optimize.minimize(lambda p: _objective(p, x, y, weight_decay)[:2],
                             np.zeros(DIM * CLASSES + CLASSES), jac=True,
                             method='L-BFGS-B',
                             options=dict(maxiter=50_000, gtol=1e-10, ftol=1e-16))
  objective, grad, ce = _objective(result.x, x, y, weight_decay)
  return dict(loss=ce, objective=objective, grad_max=float(np.abs(grad).max()))


def centralised(data: feddyn_data.SyntheticData):
  return np.concatenate(data.x), np.concatenate(data.y)


# ------------------------------------------------------------------ one search


class _Done(Exception):
  """Every target reached: ends `run_training` early (from the round callback)."""


@dataclasses.dataclass
class Search:
  """The best configuration of one method on one draw, per target, scoring the
  average of all device models (`server`: the same search scoring the server
  model)."""
  targets: dict                     # target name -> loss
  rounds: int                       # budget
  best_round: dict = dataclasses.field(default_factory=dict)   # name -> round
  best_config: dict = dataclasses.field(default_factory=dict)  # name -> config
  dropped_clients: int = 0          # non-finite clients seen (lanes not independent)
  rounds_run: int = 0
  server: Optional['Search'] = None

  def horizon(self) -> int:
    """Rounds the next shape must run to possibly beat the best so far (0: none)."""
    if len(self.best_round) < len(self.targets):
      return self.rounds
    return max(self.best_round.values()) - 1

  def describe(self) -> str:
    """Per target, the first round that reached it and with which configuration
    ('target: not reached in R rounds' for the others)."""
    def config(c):
      return ', '.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}'
                       for k, v in c.items())
    return '; '.join(
        f'{name}: round {self.best_round[name]} ({config(self.best_config[name])})'
        if name in self.best_round else f'{name}: not reached in {self.rounds} rounds'
        for name in self.targets)

  def finished(self, done: int) -> bool:
    """Every target reached by round `done`."""
    return all(self.best_round.get(n, math.inf) <= done for n in self.targets)

  def record(self, done: int, losses: np.ndarray, configs: Sequence[dict], shape):
    for name, target in self.targets.items():
      if name in self.best_round and self.best_round[name] <= done:
        continue
      hit = np.flatnonzero(np.isfinite(losses) & (losses <= target))
      if hit.size:
        self.best_round[name] = done
        self.best_config[name] = dict(configs[hit[0]], shape=shape)


def run_method(method: str, algorithms: dict, task, datas: Sequence, searches: Sequence,
               grid: Grid, seed: int, participation: float, progress: bool = False) -> None:
  """Searches every shape of `method` (`algorithms`: shape -> built) on the draws
  `datas`, the data groups of `task` side by side: search g gets lanes
  g * C .. g * C + C - 1 (dataset g, the C configurations). Each round scores
  the reported model (`get_model_weights`: the average of all device models)
  and, for a search with a `server` search, the server model
  (`process.server_model`). Stops once every search has reached every target."""
  data = [centralised(d) for d in datas]
  configs = grid.lanes(method)
  per_group = len(configs)
  stacked = stacked_logistic.stacked(task, per_group * len(datas), DIM, CLASSES,
                                     data_groups=len(datas))
  every = list(searches) + [s.server for s in searches if s.server is not None]
  for shape in grid.shapes(method):
    total = max(search.horizon() for search in every)
    if total < 1:
      break
    algorithm = algorithms[shape]

    def on_round(done, state, row, algorithm=algorithm, shape=shape):
      scored = [np.asarray(v) for v in algorithm.process.get_model_weights(state).trainable]
      server = None
      if any(search.server is not None for search in searches):
        server = [np.asarray(v) for v in algorithm.process.server_model(state).trainable]
      dropped = _dropped(row, algorithm)
      for g, (search, (x, y)) in enumerate(zip(searches, data)):
        lanes = slice(g * per_group, (g + 1) * per_group)
        search.dropped_clients += dropped
        search.rounds_run += 1
        for found, (kernel, bias) in ((search, scored), (search.server, server)):
          if found is not None:
            found.record(done, stacked_logistic.cross_entropy(kernel[lanes], bias[lanes], x, y),
                         configs, shape)
      if all(search.finished(done) for search in every):
        raise _Done

    try:
      training.run_training(
          algorithm, stacked,
          training.RunConfig(total_rounds=total, clients_per_round=1, seed=seed,
                             rounds_per_eval=0, progress=progress,
                             participation_prob=participation),
          round_callback=on_round,
          initial_weights=stacked_logistic.zero_weights(per_group * len(datas), DIM, CLASSES))
    except _Done:
      pass


# ------------------------------------------------------------------ work units


def data_groups(settings: Sequence[str], seed: int) -> list[tuple[str, ...]]:
  """The settings of one draw seed in groups that train side by side as data
  lanes of one run (`stacked_logistic`): those whose devices hold equally many
  points (homogeneous, type 1 and type 2: 200 each; type 3's sizes vary)."""
  groups: dict[tuple, list[str]] = {}
  for setting in settings:
    sizes = feddyn_data.generate_synthetic_logistic(heterogeneity=setting, seed=seed).sizes
    groups.setdefault(tuple(int(n) for n in sizes), []).append(setting)
  return [tuple(group) for group in groups.values()]


def group_task(group: Sequence[str], seed: int, batch_size: int):
  """The synthetic task of `group`'s settings at `seed`, each example holding
  every setting's point side by side, and the draws themselves."""
  task = feddyn_data.build_synthetic(TaskOptions(
      batch_size=batch_size, seed=seed, synthetic_heterogeneity=group[0]))
  datas = [feddyn_data.generate_synthetic_logistic(heterogeneity=s, seed=seed) for s in group]
  if len(group) > 1:
    task = dataclasses.replace(task, train_data=stacked_logistic.group_client_data(
        [d.x for d in datas], [d.y for d in datas]))
  return task, datas


@dataclasses.dataclass(frozen=True)
class Unit:
  """One search: `method` on the draws of `settings` (a data group) at `seed`,
  `targets[i]` the targets (name -> loss) of settings[i]."""
  method: str
  settings: tuple
  seed: int
  targets: tuple
  rounds: int
  participation: float


_BUILT: dict = {}  # (method, data groups, grid) -> {shape: algorithm}, per process


def _algorithms(method: str, groups: int, grid: Grid) -> tuple[dict, float, float]:
  """The method's algorithms for `groups` data groups (built once per process),
  and the wall and CPU seconds building them took here (0 if cached)."""
  key = (method, groups, grid, local_training.compiling())
  if key in _BUILT:
    return _BUILT[key], 0.0, 0.0
  lanes = len(grid.lanes(method)) * groups
  model_fn = lambda: stacked_logistic.StackedLogisticModel(lanes, DIM, CLASSES, groups)
  t0, c0 = time.perf_counter(), time.process_time()
  _BUILT[key] = {shape: build(method, shape, grid, model_fn, groups)
                 for shape in grid.shapes(method)}
  return _BUILT[key], time.perf_counter() - t0, time.process_time() - c0


def run_unit(unit: Unit, grid: Grid, progress: bool = False) -> tuple[list, dict]:
  """The unit's searches (one per setting: the device average's, its `server`
  the server model's) and its costs: build and run wall/CPU seconds, rounds
  run, models per round."""
  task, datas = group_task(unit.settings, unit.seed, grid.batch_size)
  # Compiled local loops (--compile_local_loop, table6's default) where every
  # device holds as many points: one XLA program per lane serves all devices.
  # Unequal devices (type 3) would compile one per device and local-work
  # shape (~0.4 s each), more than their rounds save over 500 rounds.
  equal = all(len(set(int(n) for n in d.sizes)) == 1 for d in datas)
  with local_training.compiled_loops(local_training.compiling() and equal):
    algorithms, build_s, build_cpu_s = _algorithms(unit.method, len(unit.settings), grid)
  searches = [Search(targets=dict(targets), rounds=unit.rounds,
                     server=Search(targets=dict(targets), rounds=unit.rounds))
              for targets in unit.targets]
  t0, c0 = time.perf_counter(), time.process_time()
  run_method(unit.method, algorithms, task, datas, searches, grid, unit.seed,
             unit.participation, progress)
  return searches, dict(
      build_s=build_s, build_cpu_s=build_cpu_s, run_s=time.perf_counter() - t0,
      run_cpu_s=time.process_time() - c0,
      rounds_run=max(search.rounds_run for search in searches),
      models_per_round=models_per_round(next(iter(algorithms.values()))))


def _run_unit_star(args):
  return args[0], run_unit(*args)


def run_units(units: Sequence[Unit], grid: Grid, jobs: int, runtime_options: dict,
              progress: bool = False):
  """Yields (unit, (searches, costs)) as units finish: in this process (which
  must have its TFF context installed) when `jobs` is 1, else in `jobs` worker
  processes (`runtime_flags.map_in_processes`), each unit's result the same as
  in this process."""
  yield from runtime_flags.map_in_processes(
      _run_unit_star, [(unit, grid, progress) for unit in units], jobs, runtime_options)


def figure(table: dict, methods, paper: dict, path: str) -> str:
  """table6.png: per setting, each method's models to the target (mean over
  the draws that reached it, bar: 95 % CI) next to the paper's count
  (`paper[setting][method]`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  settings = list(table)
  fig, axes = plt.subplots(1, len(settings), figsize=(3.2 * len(settings), 3.4), squeeze=False)
  x = np.arange(len(methods))
  for ax, setting in zip(axes[0], settings):
    for i, method in enumerate(methods):
      entry = table[setting][method]
      ax.plot(i + 0.22, paper[setting][method], 'kx', label='paper' if i == 0 else None)
      if entry['mean'] is None:
        ax.text(i, 0, 'not\nreached', ha='center', va='bottom', fontsize=7)
        continue
      lo, hi = entry['ci95']
      ax.bar(i, entry['mean'], width=0.5, color=f'C{i}',
             yerr=[[entry['mean'] - max(lo, 0.0)], [hi - entry['mean']]], capsize=3)
      if entry['reached'] < entry['seeds']:
        ax.text(i, entry['mean'], f"{entry['reached']}/{entry['seeds']}", ha='center',
                va='bottom', fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels(methods, fontsize=7, rotation=30)
    ax.set_title(setting, fontsize=9)
  axes[0][0].set_ylabel('models to the target loss')
  axes[0][0].legend(fontsize=7)
  fig.suptitle('Paper 003, Table 6: ours (mean over draws, bar: 95 % CI) and the paper (x)',
               fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _dropped(row: dict, algorithm) -> int:
  """Clients dropped for a non-finite update this round."""
  if 'client_work/non_finite_clients' in row:
    return int(row['client_work/non_finite_clients'])
  cohort = row['download_bytes'] / algorithm.traffic.download_bytes
  return int(round(cohort - row['client_work/finite_clients']))


# ------------------------------------------------------------------ summaries


def summarise(values: Sequence[Optional[float]]) -> dict:
  """Per-seed values (None: never reached) with mean, std and a 95 % t interval
  over the seeds that reached the target."""
  reached = [float(v) for v in values if v is not None]
  out = dict(per_seed=list(values), reached=len(reached), seeds=len(values),
             mean=None, std=None, ci95=None)
  if not reached:
    return out
  mean = float(np.mean(reached))
  std = float(np.std(reached, ddof=1)) if len(reached) > 1 else 0.0
  half = 0.0
  if len(reached) > 1:
    from scipy import stats  # pylint: disable=g-import-not-at-top
    half = float(stats.t.ppf(0.975, len(reached) - 1) * std / math.sqrt(len(reached)))
  out.update(mean=mean, std=std, ci95=[mean - half, mean + half])
  return out
