"""MFL (Liu et al. 2020, generalised in paper 004): clients run a stateful
optimiser from the global state, and both are averaged (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.mfl.config import ALGORITHMS, MFLConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
