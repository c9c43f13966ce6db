"""Mimelite (Karimireddy et al. 2021) and MimeXlite (paper 004): global
statistics tracked with client gradients at x_t (`process`)."""

from tff_algos import lazy
from tff_algos.algorithms.mime.config import ALGORITHMS, FULL_BATCH, ONE_BATCH, MimeConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'process')
