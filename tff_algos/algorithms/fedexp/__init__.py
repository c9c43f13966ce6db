"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023): FedAvg with an extrapolated,
adaptive server step size (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.fedexp.config import ALGORITHMS, FedExPConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
