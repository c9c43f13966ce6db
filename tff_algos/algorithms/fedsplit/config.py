"""FedSplit's hyperparameters (no TensorFlow)."""

from __future__ import annotations

import dataclasses

from tff_algos.algorithms import groups
from tff_algos.algorithms.algorithm import Algorithm
from tff_algos.core.hparams import above, hparam

# The server model under partial participation (paper 003, App. A.4): the mean
# of the cohort's z_i ("FedSplit Act") or of all m clients' ("FedSplit All").
SERVER_AVERAGES = ('active', 'all')


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedSplitConfig(groups.LocalSchedule, groups.LocalRegularization):
  """FedSplit's round: each sampled client solves its prox problem inexactly,
  K steps (or E epochs) of plain SGD at gamma on f_i(w) + ||w - v||^2 / (2s)
  from v = 2 x_t - z_i, and reflects z_i; x_{t+1} averages the z_i (see
  `process`).

  Where the sources settle it, and where this config chooses:
  * `server_average`: paper 003 (App. A.4, Fig. 2b) adapts FedSplit to partial
    participation in two ways and runs both, "FedSplit Act" (x_{t+1} = mean
    of the cohort's z_i^{t+1}) and "FedSplit All" (the mean of all m clients'
    z_i, a non-sampled client's unchanged). The default is Act, the variant the
    paper finds the better of the two (All moves too slowly); under full
    participation both are Pathak & Wainwright's x_{t+1} = mean_i z_i^{t+1}.
  * z_i^0 = x_0 for every client, Pathak & Wainwright's initialisation;
    paper 003 does not say, and its authors' code (alpemreacar/FedDyn) has no
    FedSplit, so nothing there to follow.
  * `step_size` s: neither paper 003's text nor its code gives one. Pathak &
    Wainwright's theory takes s ~ 1/sqrt(L mu) for mu-strongly convex,
    L-smooth f_i; the default 1 is untuned, and learns the default task at
    the trainer's defaults (tests/algorithms/test_defaults.py).
  * The local solver (plain SGD from v at the clients' gamma, K steps or E
    epochs) is paper 003's for every method; `clip_norm` and
    `client_weight_decay` act as for its other methods (the code's clipping,
    then weight decay), off by default.
  """
  step_size: float = hparam(1.0, 'FedSplit: step size s of the prox, z_i^{t+1/2} = '
                                 'prox_{s f_i}(2 x_t - z_i^t).',
                            flag='fedsplit_step_size', valid=above(0))
  server_average: str = hparam('active', 'FedSplit: x_{t+1} is the mean of the z_i of the '
                                         "round's clients ('active', paper 003's FedSplit "
                                         "Act) or of all m clients ('all', FedSplit All).",
                               flag='fedsplit_server_average', choices=SERVER_AVERAGES)
  WHY_NOT = {**groups.PLAIN_SGD_CLIENTS, **groups.why_not({
      ('uniform_weighting',): 'its server averages the clients\' z_i with equal weights, '
                              'x = mean z_i (Pathak & Wainwright)',
      groups.SERVER_STEP_FLAGS:
      'fedsplit has no server step: x_{t+1} is the mean of the z_i',
      ('report_device_average',):
      'its server model is an average of client states already; '
      '--fedsplit_server_average=all averages all m of them'})}

  def shared_build_key(self) -> 'FedSplitConfig':
    return self.shared_schedule_key()


ALGORITHMS = (Algorithm(
    'fedsplit', FedSplitConfig, 'build_fedsplit',
    'FedSplit: prox_{s f_i}(2x - z_i) by local SGD, z_i reflected (disk-backed store), '
    'x = mean z_i (--fedsplit_server_average: active or all)'),)
