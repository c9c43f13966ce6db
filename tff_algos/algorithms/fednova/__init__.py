"""FedNova (Wang et al. 2020): FedAvg with updates normalised by each client's
number of steps (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.fednova.config import ALGORITHMS, FedNovaConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
