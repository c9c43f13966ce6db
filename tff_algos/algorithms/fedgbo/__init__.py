"""FedGBO (paper 004): a global biased optimiser whose statistics stay fixed
during the local steps and are tracked at the server (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.fedgbo.config import ALGORITHMS, FedGBOConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
