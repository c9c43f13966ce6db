"""Nastya's and FedRR's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import hparam, refuse

_ONE_PASS = groups.why_not({
    groups.CLIENT_OPTIMIZER_FLAGS: 'nastya/fedrr clients run plain SGD at gamma',
    ('local_steps', 'local_steps_decay', 'client_epochs_per_round'):
    'nastya/fedrr take exactly one pass over the local data per round',
    ('uniform_weighting',): 'nastya/fedrr average the clients equally (paper 001, '
                            'Algorithm 1)'})


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedRRConfig(groups.ClientSGD, groups.ClientDecay):
  """One pass (epoch) over the local data at gamma_t, gamma_t = gamma d^t or
  divided by 10 at each milestone (FedRR; Nastya adds a server step)."""
  client_lr_milestones: tuple[int, ...] = hparam(
      (), 'nastya/fedrr: gamma divided by 10 at each of these rounds (PyTorch MultiStepLR; '
          'paper 001: 150,200).')
  WHY_NOT = {**_ONE_PASS, **groups.why_not({
      groups.SERVER_STEP_FLAGS:
      'fedrr has no server step of its own (eta_i = gamma n_i); use --algorithm=nastya for '
      'a server step size or optimizer'})}

  def check(self):
    if not self.client_learning_rate > 0:
      raise refuse('client learning rate gamma must be > 0 (g_i divides by it): '
                   '{client_learning_rate}={value}', value=self.client_learning_rate)
    milestones = list(self.client_lr_milestones)
    if milestones and (any(int(m) != m or m < 1 for m in milestones)
                       or milestones != sorted(set(milestones))):
      raise refuse('{client_lr_milestones} must be increasing rounds >= 1, got {value}',
                   value=self.client_lr_milestones)
    if milestones and self.client_lr_decay != 1.0:
      raise refuse('give either a client step decay ({client_lr_decay}) or milestones '
                   '({client_lr_milestones}), not both')

  def client_lr(self):
    """gamma_t (TensorFlow: for the builders)."""
    from tff_algos.core import schedules  # pylint: disable=g-import-not-at-top
    if self.client_lr_milestones:
      return schedules.StepDecay(self.client_learning_rate, tuple(self.client_lr_milestones))
    return schedules.ExponentialDecay(self.client_learning_rate, self.client_lr_decay)

  def client_schedule(self, server_lr=None):
    """One pass (epoch) over the local data at gamma_t (`server_lr`: eta_t)."""
    from tff_algos.core import client_work  # pylint: disable=g-import-not-at-top
    return client_work.ClientSchedule(learning_rate=self.client_lr(), local_steps=None,
                                      epochs=1, server_lr=server_lr)

  def shared_build_key(self):
    """This config with the numbers read from the state fixed (gamma, d_gamma;
    eta_0, d_eta when eta decays; a constant eta of the server optimiser, kept
    in TFF's finalizer state): configs with equal keys share one build
    (`registry.BuildCache`). Milestones keep theirs."""
    if self.client_lr_milestones:
      return self
    return dataclasses.replace(self, client_learning_rate=1.0, client_lr_decay=1.0)

  def schedule_values(self):
    return self.client_schedule().state_values()

  def shared_server_learning_rate(self) -> Optional[float]:
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class NastyaConfig(FedRRConfig, groups.ServerOptimizer, groups.ServerDecay):
  """FedRR's pass, then a server step on the clients' uniform mean g_t: SGD at
  eta (Nastya), any server optimiser, or the adaptive step of Malitsky and
  Mishchenko from eta_0 (`server_adaptive_lr`)."""
  server_adaptive_lr: bool = hparam(False, 'Nastya: adaptive server step of Malitsky & '
                                           'Mishchenko (2020), starting from '
                                           '--server_learning_rate.')
  WHY_NOT = _ONE_PASS

  def check(self):
    if self.server_adaptive_lr:
      if self.server_optimizer != 'sgd' or self.server_momentum:
        raise refuse('the adaptive server step is plain SGD; got {server_optimizer}={value}',
                     value=self.server_optimizer)
      if self.server_lr_decay != 1.0:
        raise refuse('the adaptive server step sets eta_t itself; drop {server_lr_decay}')
      if not self.server_learning_rate > 0:
        raise refuse('the adaptive server step needs an initial eta_0 > 0 '
                     '({server_learning_rate})')

  def server_rate_adapts(self) -> bool:
    return self.server_adaptive_lr

  def client_schedule(self, server_lr=None):
    """FedRR's pass, with eta_t = eta_0 d_eta^t."""
    from tff_algos.core import schedules  # pylint: disable=g-import-not-at-top
    return super().client_schedule(server_lr or schedules.ExponentialDecay(
        self.server_learning_rate, self.server_lr_decay))

  def shared_build_key(self):
    if self.client_lr_milestones:
      return self
    decaying = self.server_lr_decay != 1.0
    return dataclasses.replace(
        super().shared_build_key(),
        server_learning_rate=(self.server_learning_rate if self.server_adaptive_lr else 1.0),
        server_lr_decay=0.5 if decaying else 1.0)

  def shared_server_learning_rate(self) -> Optional[float]:
    if self.client_lr_milestones or self.server_adaptive_lr or self.server_lr_decay != 1.0:
      return None
    return self.server_learning_rate


ALGORITHMS = (
    Algorithm('nastya', NastyaConfig, 'build_nastya',
              'Nastya (paper 001): one RR/SO pass at gamma, g_i = delta/(gamma n_i), server '
              'step eta (or adam..., --server_adaptive_lr); uniform mean'),
    Algorithm('fedrr', FedRRConfig, 'build_fedrr',
              'FedRR: one RR/SO pass at gamma, server averages the local models (Nastya '
              'with eta = gamma n)'),
)
