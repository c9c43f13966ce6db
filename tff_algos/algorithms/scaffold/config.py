"""SCAFFOLD's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import hparam, refuse


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaffoldConfig(groups.LocalSchedule, groups.ServerRate, groups.LocalRegularization,
                     groups.DeviceAverage):
  """SCAFFOLD's round (option II): plain local SGD corrected by c - c_i, a
  global step eta_g = `server_learning_rate` (see `process`)."""
  reference_conventions: bool = hparam(
      False, "SCAFFOLD as paper 003's code: c scaled by mean n / n_i in the local step and "
             "n_i / mean n in the server sum; c_i+ divides by the initial learning rate.",
      flag='scaffold_reference_conventions')
  WHY_NOT = {**groups.PLAIN_SGD_CLIENTS, **groups.why_not({
      ('uniform_weighting',): 'its server step averages the sampled clients with equal '
                              'weights, x += eta_g mean dy, as Karimireddy et al. and paper 003',
      (*groups.SERVER_OPTIMIZER_FLAGS, 'server_lr_decay'):
      'scaffold takes a plain global step eta_g = --server_learning_rate'})}

  def check(self):
    if not self.client_learning_rate > 0:
      raise refuse('scaffold needs a client learning rate gamma > 0 (c_i+ divides by K '
                   'gamma), got {client_learning_rate}={value}', value=self.client_learning_rate)
    if not self.server_learning_rate > 0:
      raise refuse('scaffold global step eta_g must be > 0, got {server_learning_rate}={value}',
                   value=self.server_learning_rate)


ALGORITHMS = (Algorithm(
    'scaffold', ScaffoldConfig, 'build_scaffold',
    'SCAFFOLD (option II): control variates c, c_i (disk-backed store), global step eta_g '
    '= --server_learning_rate'),)
