"""FedSplit (Pathak & Wainwright, NeurIPS 2020): Peaceman-Rachford operator
splitting with a state z_i per client, paper 003's baseline (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.fedsplit.config import ALGORITHMS, FedSplitConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
