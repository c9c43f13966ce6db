"""FedProx (Li et al. 2020): FedOpt with a proximal term (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.fedprox.config import ALGORITHMS, FedProxConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
