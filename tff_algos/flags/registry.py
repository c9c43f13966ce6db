"""Algorithm name -> `AlgorithmSpec`: the trainer's algorithms, one line each.

This module imports no TensorFlow: names, flag rules and defaults are answered
at once; an algorithm's module is imported only to check its config or build
it. Adding an algorithm: its module (a config class with `from_hparams(hp)`
and a builder `build_<name>(model_fn, config, name)`), one `AlgorithmSpec`
below naming them, and its test (see the README).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import importlib
from typing import TYPE_CHECKING

from tff_algos.flags import rules
from tff_algos.flags.hparams import AlgorithmSpec, HParams

if TYPE_CHECKING:
  from tff_algos.core.algorithm import FederatedAlgorithm

_LOCAL_STEP_REGULARIZATION = frozenset({'client_weight_decay', 'clip_norm'})
_DEVICE_AVERAGE = _LOCAL_STEP_REGULARIZATION | {'report_device_average'}
_GBO = frozenset({'gbo_reference_conventions'})
# LocalUpdate's flags (paper 002): the reference semantics also switch the
# family's means to example weights; Theta's weights; the plateau rule.
_LOCAL_UPDATE = frozenset({'decay_reference_semantics'})
_THETA = _LOCAL_UPDATE | {'theta'}
_PLATEAU = _THETA | {'decay_min_delta', 'client_lr_decay_factor', 'server_lr_decay_factor',
                     'decay_patience', 'decay_window', 'decay_cooldown'}
_NASTYA = 'Nastya (paper 001): one RR/SO pass at gamma, g_i = delta/(gamma n_i), server step ' \
          'eta (or adam..., --server_adaptive_lr); uniform mean'


def _local_update(name: str, description: str, preset: bool = True) -> AlgorithmSpec:
  """LocalUpdate with the Theta preset `name` (`preset`), or --theta."""
  return AlgorithmSpec(name, 'tff_algos.algorithms.local_update', description, 'LocalUpdateConfig',
                       'build_local_update', _LOCAL_UPDATE if preset else _THETA,
                       rules.local_update(name), config_args={'theta': name} if preset else {})


_SPECS = (
    AlgorithmSpec('fedavg', 'tff_algos.algorithms.fedprox', 'FedAvg/FedOpt: K steps or E epochs, any '
                  'server optimizer', 'FedProxConfig', 'build_fedavg',
                  _DEVICE_AVERAGE | {'token_weighting'},
                  rules.client_schedule, config_args={'mu': 0.0}),
    AlgorithmSpec('fedsgd', 'tff_algos.algorithms.fedopt', 'FedSGD: one gradient per client, server '
                  'optimizer step', 'FedSGDConfig', 'build_fedsgd', check=rules.fedsgd),
    _local_update('local_update', 'LocalUpdate with --theta (preset or weights), server '
                  'optimizer', preset=False),
    _local_update('reptile', 'LocalUpdate, Theta_{1:K}: FedAvg/Reptile (q in gradient units)'),
    _local_update('fomaml', 'LocalUpdate, Theta_K: first-order MAML'),
    _local_update('kmaml', 'LocalUpdate, Theta_{2K+1}: K-MAML'),
    _local_update('minibatch_sgd', 'LocalUpdate, Theta_1: distributed minibatch SGD'),
    AlgorithmSpec('local_update_decay', 'tff_algos.algorithms.local_update', 'LocalUpdateDecay: plateau '
                  'decay of gamma and eta on the pre-training loss', 'LocalUpdateDecayConfig',
                  'build_local_update_decay', _PLATEAU, rules.local_update('local_update_decay')),
    AlgorithmSpec('nastya', 'tff_algos.algorithms.nastya', _NASTYA, 'NastyaConfig', 'build_nastya',
                  frozenset({'server_adaptive_lr', 'client_lr_milestones'}),
                  rules.nastya('nastya')),
    AlgorithmSpec('fedrr', 'tff_algos.algorithms.nastya', 'FedRR: one RR/SO pass at gamma, server '
                  'averages the local models (Nastya with eta = gamma n)', 'NastyaConfig',
                  'build_fedrr', frozenset({'client_lr_milestones'}), rules.nastya('fedrr')),
    AlgorithmSpec('feddyn', 'tff_algos.algorithms.feddyn', 'FedDyn (paper 003): dynamic regulariser '
                  'alpha, per-client state grad L_k (disk-backed store), server h',
                  'FedDynConfig', 'build_feddyn',
                  _DEVICE_AVERAGE | {'feddyn_alpha', 'feddyn_adaptive_alpha',
                                     'feddyn_weight_decay_form'}, rules.feddyn),
    AlgorithmSpec('scaffold', 'tff_algos.algorithms.scaffold', 'SCAFFOLD (option II): control variates '
                  'c, c_i (disk-backed store), global step eta_g = --server_learning_rate',
                  'ScaffoldConfig', 'build_scaffold',
                  _DEVICE_AVERAGE | {'scaffold_reference_conventions'}, rules.scaffold),
    AlgorithmSpec('fedprox', 'tff_algos.algorithms.fedprox', 'FedProx: FedAvg/FedOpt with proximal term '
                  'mu/2 ||theta - x_t||^2 (--prox_mu); K steps or E epochs, any server '
                  'optimizer', 'FedProxConfig', 'build_fedprox', _DEVICE_AVERAGE | {'prox_mu'},
                  rules.client_schedule),
    AlgorithmSpec('fednova', 'tff_algos.algorithms.fednova', 'FedNova (recipe example): local SGD '
                  'updates normalised by their steps tau_i, server step eta tau_eff',
                  'FedNovaConfig', 'build_fednova', check=rules.fednova),
    AlgorithmSpec('fedmax', 'tff_algos.algorithms.fedmax', 'FedMAX: FedAvg + beta KL(softmax(penultimate) '
                  '|| uniform)', 'FedMaxConfig', 'build_fedmax',
                  _LOCAL_STEP_REGULARIZATION | {'fedmax_beta', 'fedmax_reference_kl'},
                  rules.client_schedule),
    AlgorithmSpec('fedgbo', 'tff_algos.algorithms.fedgbo', 'FedGBO (paper 004): client sgdm/rmsprop/adam '
                  'with global statistics fixed during K local steps, tracked by the inverse '
                  'step', 'FedGBOConfig', 'build_fedgbo', _GBO, rules.fedgbo,
                  rules.paper_defaults),
    AlgorithmSpec('mfl', 'tff_algos.algorithms.mfl', 'MFL: client sgdm/rmsprop/adam from the global '
                  'state; models and optimiser states averaged', 'MFLConfig', 'build_mfl',
                  _GBO, rules.mfl, rules.paper_defaults),
    AlgorithmSpec('mimelite', 'tff_algos.algorithms.mime', 'Mimelite: fixed global statistics tracked '
                  'with full-batch client gradients at x_t (uploads x and grad f)',
                  'MimeConfig', 'build_mime', _GBO, rules.mime('mimelite'),
                  rules.paper_defaults, config_args={'gradient': 'full_batch'}),
    AlgorithmSpec('mimexlite', 'tff_algos.algorithms.mime', 'MimeXlite (paper 004): Mimelite with one '
                  'minibatch gradient at x_t', 'MimeConfig', 'build_mime', _GBO,
                  rules.mime('mimexlite'), rules.paper_defaults,
                  config_args={'gradient': 'one_batch'}),
)

ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for spec in _SPECS}


def unknown(names, flag: str = '') -> str:
  """'' when every name is registered, else the one line that says which are
  not (`flag`, e.g. '--algorithms', first), the closest registered names and
  all of them: every binary that takes algorithm names says it this way."""
  bad = [n for n in names if n not in ALGORITHMS]
  if not bad:
    return ''
  close = [c for n in bad for c in difflib.get_close_matches(n, list(ALGORITHMS), n=1)]
  hint = f' (did you mean {" or ".join(dict.fromkeys(close))}?)' if close else ''
  return (f'{flag + ": " if flag else ""}unknown algorithm'
          f'{"s" if len(bad) > 1 else ""} {", ".join(map(repr, bad))}{hint}; '
          f'choose from {", ".join(sorted(ALGORITHMS))}')


def get(name: str) -> AlgorithmSpec:
  if name not in ALGORITHMS:
    raise ValueError(unknown([name]))
  return ALGORITHMS[name]


def _users_of_flags() -> dict[str, frozenset[str]]:
  users: dict[str, set[str]] = {}
  for spec in _SPECS:
    for flag in spec.reads:
      users.setdefault(flag, set()).add(spec.name)
  return {flag: frozenset(names) for flag, names in sorted(users.items())}


# Flags that only some algorithms read (from the specs' `reads`): setting one
# for another algorithm is an error, not a silent no-op.
ALGORITHM_SPECIFIC_FLAGS: dict[str, frozenset[str]] = _users_of_flags()


def _set_flags(hp: HParams) -> list[tuple[str, frozenset[str]]]:
  """(flag, its users) for each algorithm-specific flag that `hp` sets."""
  defaults = HParams()
  return [(flag, users) for flag, users in ALGORITHM_SPECIFIC_FLAGS.items()
          if getattr(hp, flag) != getattr(defaults, flag)]


def check_specific_flags(name: str, hp: HParams) -> None:
  for flag, users in _set_flags(hp):
    if name not in users:
      raise ValueError(f'--{flag} is not used by {name} (only by '
                       f'{", ".join(sorted(users))}); leave it at its default')


def ignored_flags(names, hp: HParams) -> dict[str, list[str]]:
  """Algorithm-specific flags set in `hp` -> the algorithms of `names` that do not
  use them (a grid runs those without; its binary says so)."""
  ignoring = {flag: [n for n in names if n not in users] for flag, users in _set_flags(hp)}
  if hp.uniform_weighting:
    ignoring['uniform_weighting'] = [n for n in names if n in rules.EQUAL_WEIGHTED]
  return {flag: ignored for flag, ignored in ignoring.items() if ignored}


def for_algorithm(name: str, hp: HParams) -> HParams:
  """`hp` with other algorithms' specific flags at their defaults (for grids
  that pass one set of flags to several algorithms), and --uniform_weighting
  unset for the algorithms whose means are equal-weighted already (the trainer
  refuses it for them; a grid's FedAvg beside them takes it)."""
  defaults = HParams()
  reset = {flag: getattr(defaults, flag) for flag, users in ALGORITHM_SPECIFIC_FLAGS.items()
           if name not in users}
  if name in rules.EQUAL_WEIGHTED:
    reset['uniform_weighting'] = defaults.uniform_weighting
  return dataclasses.replace(hp, **reset)


def with_defaults(name: str, hp: HParams, unset) -> HParams:
  """`hp` with `name`'s own defaults for the flags in `unset` (those left unset)."""
  spec = ALGORITHMS.get(name)
  if spec is None or spec.defaults is None:
    return hp
  return dataclasses.replace(hp, **spec.defaults(frozenset(unset)))


def check_flags(name: str, hp: HParams) -> AlgorithmSpec:
  """The checks that need no TensorFlow: the name, other algorithms' flags,
  the optimiser specs and the algorithm's flag rules (raise ValueError)."""
  spec = get(name)
  check_specific_flags(name, hp)
  rules.client_step(hp)
  if spec.check is not None:
    spec.check(hp)
  hp.client_optimizer_spec()
  hp.server_optimizer_spec()
  return spec


def _module(spec: AlgorithmSpec):
  return importlib.import_module(spec.module)


def config(name: str, hp: HParams):
  """`name`'s config from `hp`, after the checks without TensorFlow
  (imports the algorithm's module, so TensorFlow; raises ValueError)."""
  spec = check_flags(name, hp)
  return getattr(_module(spec), spec.config).from_hparams(hp, **spec.config_args)


def check(name: str, hp: HParams) -> AlgorithmSpec:
  """All checks, the config's included; raises ValueError before any tracing."""
  config(name, hp)
  return get(name)


def build(name: str, model_fn, hp: HParams) -> FederatedAlgorithm:
  """`spec.builder(model_fn, config, name)` of `name`'s spec, checked first."""
  spec = get(name)
  return getattr(_module(spec), spec.builder)(model_fn, config(name, hp), name)


class BuildCache:
  """`build`, with each algorithm built (and, on its first round, traced) once
  per process for the runs of a grid, a reproduction's seeds or a sweep.

  Runs whose configs are equal share one build (seeds are not part of a
  config). So do runs of an algorithm whose config has `shared_build_key()`
  when their keys are equal: those differ only in numbers its computations
  read from the state (the client schedule's gamma_0, d_gamma, K_0, d_K, and
  the server optimiser's eta where TFF's finalizer keeps it), which the
  trainer sets from `config.schedule_values()` (and
  `config.shared_server_learning_rate()`) into the initial state. Keys
  include `model_fn` itself: reuse one task object per task. `made` counts
  the builds made (a caller compares it to tell a reused build).
  """

  MAX_BUILDS = 32  # the least recently used build is dropped beyond this

  def __init__(self):
    self._built: collections.OrderedDict = collections.OrderedDict()
    self.made = 0

  def __len__(self) -> int:
    return len(self._built)

  def clear(self) -> None:
    """Drops every kept build (`made` keeps counting)."""
    self._built.clear()

  def build(self, name: str, model_fn, hp: HParams) -> FederatedAlgorithm:
    """`registry.build(name, model_fn, hp)`, built once per key."""
    spec = get(name)
    return self.build_config(getattr(_module(spec), spec.builder), model_fn,
                             config(name, hp), name)

  def build_config(self, builder, model_fn, cfg, name: str) -> FederatedAlgorithm:
    """`builder(model_fn, cfg, name)` (an algorithm module's `build_<name>`),
    built once per key."""
    shared = getattr(cfg, 'shared_build_key', None)
    from tff_algos.core import local_training  # pylint: disable=g-import-not-at-top
    # Whether client loops are compiled (`local_training.compiled_loops`) is
    # part of what is built.
    key = (name, builder, model_fn, shared() if shared is not None else cfg,
           local_training.compiling())
    try:
      hash(key)
    except TypeError:  # a config holding a list: built each time
      self.made += 1
      return builder(model_fn, cfg, name)
    if key not in self._built:
      if len(self._built) >= self.MAX_BUILDS:
        self._built.popitem(last=False)
      self._built[key] = builder(model_fn, cfg, name)
      self.made += 1
      return self._built[key]
    self._built.move_to_end(key)
    algorithm = self._built[key]
    if shared is not None:
      algorithm = dataclasses.replace(
          algorithm, schedule_values=cfg.schedule_values(),
          server_learning_rate=getattr(cfg, 'shared_server_learning_rate', lambda: None)())
    return algorithm
