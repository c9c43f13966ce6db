"""FedMAX (Chen et al. 2020): FedAvg with a maximum-entropy term on the
penultimate activations (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.fedmax.config import ALGORITHMS, FedMaxConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
