"""LocalUpdate and LocalUpdateDecay (paper 002): the Theta family of local
update methods (`process`) and the plateau rule of the decay (`plateau`)."""

from tff_algos import lazy
from tff_algos.algorithms.local_update.config import (ALGORITHMS, PRESETS, LocalUpdateConfig,
                                                      LocalUpdateDecayConfig, parse_theta,
                                                      theta_preset)

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
