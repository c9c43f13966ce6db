"""Paper 003's Shakespeare samples (LEAF's next-character task), from role texts.

A sample is an 80-character window of a role's text and the character that
follows it (LEAF: the text with newlines as spaces and runs of spaces as one,
windows at every offset; characters as indices into LEAF's 80 letters). The
paper (App. A.2) uses 100 devices with at most 2,000 samples each; the authors'
code builds them so (their test set: 400 samples per device, 40,000 in all):

* 'natural' (non-IID, one device per role): the roles with more than 2,000
  training and 400 test samples, shuffled with the seed, the first 100; each
  device holds 2,000 consecutive training samples from a random start, and
  gives 400 consecutive test samples from a random start;
* 'iid': LEAF's IID split pools the samples of all roles and deals them out at
  random; here 100 x 2,000 training and 100 x 400 test samples are drawn
  without replacement from all roles' windows.

Roles come from TFF's Shakespeare (the LEAF data, split into train and test
per role by TFF); its per-role train/test texts stand in for LEAF's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from tasks import catalog
from tasks import partition

LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
           'abcdefghijklmnopqrstuvwxyz}')
WINDOW = 80
CROP, TEST_CROP = 2000, 400
SPLITS = catalog.SHAKESPEARE_003_SPLITS
_INDEX = np.full(256, LETTERS.index(' '), np.uint8)   # other characters: the space
_INDEX[[ord(c) for c in LETTERS]] = np.arange(len(LETTERS), dtype=np.uint8)


def encode(text: str) -> np.ndarray:
  """LEAF's text cleaning, then letter indices (uint8)."""
  text = re.sub(' {2,}', ' ', text.replace('\n', ' '))
  codes = np.frombuffer(text.encode('latin-1', errors='replace'), np.uint8)
  return _INDEX[codes]


def num_samples(codes: np.ndarray, window: int = WINDOW) -> int:
  return max(0, len(codes) - window)


def windows(codes: np.ndarray, starts: np.ndarray, window: int = WINDOW):
  """(x [n, window], y [n]) for the samples starting at `starts`."""
  starts = np.asarray(starts, np.int64)
  x = codes[starts[:, None] + np.arange(window)]
  return x, codes[starts + window].astype(np.int32)


@dataclasses.dataclass(frozen=True)
class Samples(partition.ClientArrays):
  """Per device [CROP, WINDOW] uint8 windows (`x`) and [CROP] next characters."""
  roles: list      # the role index of each device ('natural'), or None


def eligible_roles(train, test, crop: int = CROP, test_crop: int = TEST_CROP,
                   window: int = WINDOW) -> list[int]:
  """Roles with more than `crop` training and `test_crop` test samples."""
  return [k for k in range(len(train))
          if num_samples(train[k], window) > crop and num_samples(test[k], window) > test_crop]


def natural_split(train: Sequence[np.ndarray], test: Sequence[np.ndarray],
                  num_devices: int, seed: int, crop: int = CROP,
                  test_crop: int = TEST_CROP, window: int = WINDOW) -> Samples:
  """One device per role (see the module docstring)."""
  eligible = eligible_roles(train, test, crop, test_crop, window)
  if len(eligible) < num_devices:
    raise ValueError(f'only {len(eligible)} roles have more than {crop} training and '
                     f'{test_crop} test samples; {num_devices} devices asked')
  roles = list(np.random.default_rng([seed, 3]).permutation(eligible)[:num_devices])
  xs, ys, xt, yt = [], [], [], []
  for i, k in enumerate(roles):
    rng = np.random.default_rng([seed, 3, i])
    start = rng.integers(num_samples(train[k], window) - crop)
    x, y = windows(train[k], start + np.arange(crop), window)
    xs.append(x); ys.append(y)
    start = rng.integers(num_samples(test[k], window) - test_crop)
    x, y = windows(test[k], start + np.arange(test_crop), window)
    xt.append(x); yt.append(y)
  return Samples(xs, ys, np.concatenate(xt), np.concatenate(yt), [int(k) for k in roles])


def _pooled(texts: Sequence[np.ndarray], count: int, rng, window: int):
  """`count` samples drawn without replacement from every text's windows."""
  sizes = np.array([num_samples(t, window) for t in texts], np.int64)
  if sizes.sum() < count:
    raise ValueError(f'only {sizes.sum()} samples in all roles; {count} asked')
  chosen = np.sort(rng.choice(sizes.sum(), count, replace=False))
  role = np.searchsorted(np.cumsum(sizes), chosen, side='right')
  offset = chosen - np.concatenate([[0], np.cumsum(sizes)])[role]
  x = np.empty((count, window), np.uint8)
  y = np.empty(count, np.int32)
  for k in np.unique(role):
    at = role == k
    x[at], y[at] = windows(texts[k], offset[at], window)
  order = rng.permutation(count)
  return x[order], y[order]


def iid_split(train: Sequence[np.ndarray], test: Sequence[np.ndarray], num_devices: int,
              seed: int, crop: int = CROP, test_crop: int = TEST_CROP,
              window: int = WINDOW) -> Samples:
  """Samples of all roles dealt out at random (see the module docstring)."""
  rng = np.random.default_rng([seed, 4])
  x, y = _pooled(train, num_devices * crop, rng, window)
  x_test, y_test = _pooled(test, num_devices * test_crop, rng, window)
  return Samples(list(x.reshape(num_devices, crop, window)), list(y.reshape(num_devices, crop)),
                 x_test, y_test, None)


def split(train, test, scheme: str, num_devices: int, seed: int, **sizes) -> Samples:
  if scheme not in SPLITS:
    raise ValueError(f'shakespeare_003 splits {"|".join(SPLITS)} (--partition), '
                     f'not {scheme!r}')
  fn = natural_split if scheme == 'natural' else iid_split
  return fn(train, test, num_devices, seed, **sizes)
