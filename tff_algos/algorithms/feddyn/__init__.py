"""FedDyn (paper 003): federated learning with dynamic regularisation, with a
state per client (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.feddyn.config import ALGORITHMS, FedDynConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
