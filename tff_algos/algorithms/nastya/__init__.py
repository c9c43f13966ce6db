"""Nastya and FedRR (paper 001): one Random Reshuffling pass per round, a server
step size (`process`), the adaptive step of Malitsky and Mishchenko
(`adaptive_step`)."""

from tff_algos import lazy
from tff_algos.algorithms.nastya.config import ALGORITHMS, FedRRConfig, NastyaConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
