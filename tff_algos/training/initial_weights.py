"""A run's initial model weights, drawn once per (model, seed) in a process,
and the order that lets a process's runs share those draws (`seed_major`)."""

from __future__ import annotations

import random
import sys
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.training.task import Task


def initial_model_weights(task: Task, seed: int) -> tff.learning.models.ModelWeights:
  """The model's initial weights, drawn after seeding TF, numpy and Python.

  (`tf.random.set_seed` alone does not make unseeded Keras initialisers repeat
  within a process; `tf.keras.utils.set_random_seed` does.)

  A process draws them once per (model, seed) and keeps them, with Python's
  and numpy's random states as the draw left them, which a later call
  restores. Re-seeding TensorFlow clears its kernel cache, so the next round
  instantiated every function of the round again: 0.4-0.7 s of each run of the
  benchmark's 12-run grid (~0.9 s a run). A draw is reused only while
  TensorFlow's global seed is still `seed` (runs of one seed in a row; another
  seed in between re-seeds, as a client's shuffle combines its seed with the
  global one). Where this process imported a TFF
  computation with a seeded stateful random op (in-process backend), every call
  draws again: the cleared cache restarts those ops' streams, as a separate run
  starts them.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  graph_import = sys.modules.get('tff_algos.runtime.inprocess.graph_import')
  reseed = (graph_import is not None and graph_import.seeded_random_imported
            # The run's seeded ops (a client's shuffle) combine their seeds with
            # TF's global seed: a draw is reused only while it is still `seed`.
            or context.global_seed() != seed)
  kept = _INITIAL_WEIGHTS.get((id(task.model_fn), seed))
  if kept is None or kept[0] is not task.model_fn or reseed:
    tf.keras.utils.set_random_seed(seed)
    model = task.model_fn()
    weights = tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in model.trainable_variables],
        non_trainable=[v.numpy() for v in model.non_trainable_variables])
    if len(_INITIAL_WEIGHTS) >= _MAX_KEPT_INITIAL_WEIGHTS:
      _INITIAL_WEIGHTS.pop(next(iter(_INITIAL_WEIGHTS)))
    kept = (task.model_fn, weights, random.getstate(), np.random.get_state())
    _INITIAL_WEIGHTS[(id(task.model_fn), seed)] = kept
  _, weights, python_state, numpy_state = kept
  random.setstate(python_state)
  np.random.set_state(numpy_state)
  return tf.nest.map_structure(np.copy, weights)


# (id(model_fn), seed) -> (model_fn, weights, Python's and numpy's random states).
_INITIAL_WEIGHTS: dict = {}
_MAX_KEPT_INITIAL_WEIGHTS = 8


def seed_major(items: list, seed: Callable[[Any], Any]) -> list[int]:
  """Indices of `items` with equal seeds together (each seed's items in their
  order; seeds in order of first appearance), the order to run them in one
  process.

  A run seeds TensorFlow for its initial weights (`initial_model_weights`),
  which clears TensorFlow's kernel cache: the next round instantiates the whole
  round computation again (0.4-0.7 s on the quadratic toy). Runs of one seed in
  a row seed it once, and runs that share a build share its instantiation.
  Results do not depend on the order while every random draw of a run is
  seeded explicitly (the library's sampling, shuffles and augmentation are):
  a run that reuses its seed's initial weights restores Python's and numpy's
  random states, not TensorFlow's op-seed counter or Keras's generator.
  """
  first = {}
  for item in items:
    first.setdefault(seed(item), len(first))
  return sorted(range(len(items)), key=lambda i: first[seed(items[i])])
