"""The client optimiser with statistics that FedGBO, MFL and Mime(X)lite share
(paper 004): its hyperparameters and their rules (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

from tff_algos.algorithms import groups
from tff_algos.core.hparams import hparam, refuse, reuse

STATISTICS_OPTIMIZERS = ('sgdm', 'rmsprop', 'adam')
REFERENCE_EPSILON = 1e-3   # the authors' code: v_0 = 1, no bias correction, eps 1e-3


def _client(name: str, default=None) -> Any:
  return reuse(groups.ClientOptimizer, name, default)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StatisticsOptimizer(groups.ClientSGD, groups.Weighting):
  """SGDm (m), RMSProp (v) or Adam (m, v) written as update U, tracking T and
  inverse I (`gbo.optimizers`), at the client learning rate; paper 004's SGDm
  (beta 0.9) unless set. Defaults where the paper is silent: Adam's beta_2 =
  0.99 and RMSProp's decay 0.9, eps = 1e-3 (Sec. 5), statistics from 0 with
  Adam's bias correction, clients
  weighted by n_i; `reference_conventions`: the authors' code (v_0 = 1, no bias
  correction, eps = 1e-3, the plain client mean). `optimizer`: an optimiser of
  your own (a `gbo.optimizers.GBOOptimizer`) instead of the client_* fields."""
  client_optimizer: str = _client('client_optimizer', 'sgdm')
  client_momentum: Optional[float] = _client('client_momentum')
  client_beta_1: Optional[float] = _client('client_beta_1')
  client_beta_2: Optional[float] = _client('client_beta_2')
  client_epsilon: Optional[float] = _client('client_epsilon')
  reference_conventions: bool = hparam(
      False, "FedGBO/MFL/Mimelite/MimeXlite: the reference code's conventions (v_0 = 1, no "
             "bias correction, eps = 1e-3, unweighted client mean).",
      flag='gbo_reference_conventions')
  optimizer: Any = None   # a GBOOptimizer of your own (Python API only)

  # What is said of an optimiser without statistics.
  NEEDS_STATISTICS: ClassVar[str] = (
      '{algorithm} needs {client_optimizer} in %s (an optimiser with statistics), got '
      '{value!r}' % (STATISTICS_OPTIMIZERS,))

  def check(self):
    if self.optimizer is not None:
      return
    groups.optimizer_spec(self, 'client')  # ranges; hyperparameters it lacks
    name = self.client_optimizer
    if name not in STATISTICS_OPTIMIZERS:
      raise refuse(self.NEEDS_STATISTICS, value=name)
    if name == 'sgdm' and self.client_beta_1 is not None:
      raise refuse('SGDm: set beta with {client_momentum}, not {client_beta_1}')
    if self.client_epsilon is not None and not self.client_epsilon > 0:
      raise refuse('{client_epsilon} must be > 0, got {value}', value=self.client_epsilon)
    if self.reference_conventions and self.client_epsilon not in (None, REFERENCE_EPSILON):
      raise refuse('the reference conventions ({reference_conventions}) fix epsilon = 1e-3, '
                   'got {client_epsilon}={value}', value=self.client_epsilon)

  @property
  def plain_mean(self) -> bool:
    """Whether the server's means weight clients equally (else by n_i)."""
    return self.uniform_weighting or self.reference_conventions


SERVER_AVERAGES = groups.why_not({
    groups.SERVER_STEP_FLAGS:
    'the server averages the client models, no server optimizer'})
