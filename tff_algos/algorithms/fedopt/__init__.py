"""FedAvg/FedOpt and FedSGD (`process`), with server optimisers and paper 000's
decaying K, gamma, eta; `FedOptConfig` is what FedProx and FedMAX build on."""

from tff_algos import lazy
from tff_algos.algorithms.fedopt.config import ALGORITHMS, FedAvgConfig, FedOptConfig, FedSGDConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
