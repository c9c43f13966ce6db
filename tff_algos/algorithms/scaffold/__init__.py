"""SCAFFOLD (Karimireddy et al. 2020, option II): control variates per client
and at the server (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.scaffold.config import ALGORITHMS, ScaffoldConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
