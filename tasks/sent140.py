"""Sent140 as in paper 004, from LEAF's preprocessed JSON files.

LEAF (`cd data/sent140 && ./preprocess.sh -s niid --sf 1.0 -k 10 -t sample`)
groups tweets by user, drops users with < 10 posts and puts 20% of each user's
samples in the test split: `<dir>/train/*.json`, `<dir>/test/*.json`, each
{"users": [...], "user_data": {user: {"x": [[id, date, query, user, text]],
"y": [0|1]}}}. Paper 004: a normalised bag of words over the 5k most common
(training) tokens, samples with none of them dropped, a linear model, B = 8.
Not in the task registry (it needs a directory, not TaskOptions): used by
`experiments.fedgbo --tasks=sent140 --sent140_dir=...`.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re

import numpy as np
import tensorflow as tf

from tasks import base
from tasks import partition

VOCAB_SIZE = 5000
EXPECTED = ('LEAF Sent140 JSON files <dir>/train/*.json and <dir>/test/*.json '
            '(from LEAF: cd data/sent140 && ./preprocess.sh -s niid --sf 1.0 -k 10 '
            '-t sample; then --sent140_dir=data/sent140/data)')


def files(directory) -> tuple[list[str], list[str]]:
  """LEAF's train/test JSON files, or a ValueError naming what is expected."""
  if not directory:
    raise ValueError(f'Sent140 needs --sent140_dir: {EXPECTED}')
  directory = os.path.expanduser(directory)
  train = sorted(glob.glob(os.path.join(directory, 'train', '*.json')))
  test = sorted(glob.glob(os.path.join(directory, 'test', '*.json')))
  if not train or not test:
    missing = 'train/*.json' if not train else 'test/*.json'
    raise ValueError(f'--sent140_dir={directory} has no {missing}; expected {EXPECTED}')
  return train, test


def _users(paths) -> dict[str, tuple[list[str], list[int]]]:
  users = collections.OrderedDict()
  for path in paths:
    with open(path) as f:
      blob = json.load(f)
    for user in blob['users']:
      data = blob['user_data'][user]
      texts, labels = users.setdefault(user, ([], []))
      texts.extend(x[4] if isinstance(x, list) else str(x) for x in data['x'])
      labels.extend(int(y) for y in data['y'])
  return users


def _tokens(text: str) -> list[str]:
  return re.findall(r"[a-z0-9']+", text.lower())


def build(directory: str, batch_size: int = 8, vocab_size: int = VOCAB_SIZE) -> base.Task:
  train_files, test_files = files(directory)
  train, test = _users(train_files), _users(test_files)
  counts = collections.Counter(t for texts, _ in train.values() for s in texts
                               for t in _tokens(s))
  vocab = {t: i for i, (t, _) in enumerate(counts.most_common(vocab_size))}

  def featurise(texts, labels):
    x = np.zeros((len(texts), len(vocab)), np.float32)
    for row, text in enumerate(texts):
      for t in set(_tokens(text)):
        if t in vocab:
          x[row, vocab[t]] = 1.0
    norm = np.linalg.norm(x, axis=1)
    keep = norm > 0
    return x[keep] / norm[keep, None], np.asarray(labels, np.int32)[keep]

  xs, ys, parts, start = [], [], [], 0
  for texts, labels in train.values():
    x, y = featurise(texts, labels)
    if len(y):
      xs.append(x)
      ys.append(y)
      parts.append(np.arange(start, start + len(y)))
      start += len(y)
  client_data = partition.to_client_data(
      collections.OrderedDict(x=np.concatenate(xs), y=np.concatenate(ys)), parts)
  tx, ty = zip(*(featurise(t, l) for t, l in test.values()))
  test_data = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.concatenate(tx), y=np.concatenate(ty))).batch(500)
  spec = collections.OrderedDict(x=tf.TensorSpec([None, len(vocab)], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  model_fn = base.logits_classifier_fn(
      lambda: tf.keras.Sequential([tf.keras.Input((len(vocab),)), tf.keras.layers.Dense(2)]),
      spec)
  return base.Task(
      name='sent140', train_data=client_data,
      preprocess_fn=lambda ds: ds.batch(batch_size), model_fn=model_fn,
      test_data=test_data,
      info=dict(model='linear', source='leaf', vocab_size=len(vocab),
                num_train_clients=len(parts), num_train_examples=start))
