"""Centralised evaluation of a task's test set, and metrics as flat rows.

`build_evaluator(task)` evaluates model weights in plain TensorFlow (no TFF
computation: the round loop calls it between rounds); `cached_evaluator`
builds it once per task object, so that the runs of a grid trace it once.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf

from tff_algos.core import local_training
from tff_algos.training.task import Task


def flatten_metrics(metrics, prefix: str = '') -> dict[str, Any]:
  """Nested measurements -> {'a/b/c': python scalar}."""
  if hasattr(metrics, '_asdict'):
    metrics = metrics._asdict()
  if isinstance(metrics, Mapping):
    out = {}
    for key, value in metrics.items():
      out.update(flatten_metrics(value, f'{prefix}{key}/'))
    return out
  value = np.asarray(metrics)
  return {prefix[:-1]: value.item() if value.size == 1 else value.tolist()}


# The evaluators of the last few (task, max_examples), by the task's identity:
# the runs of a grid or a reproduction share one task and trace its
# evaluation once. (A task is not hashable; the entry holds it, so its id
# stays its own.)
_EVALUATORS: collections.OrderedDict = collections.OrderedDict()
_EVALUATORS_KEPT = 2


def cached_evaluator(task: Task, max_examples: Optional[int] = None
                     ) -> Callable[..., dict[str, float]]:
  """`build_evaluator(task, max_examples)`, built once per task object (it
  keeps no state between calls: each sets the weights and resets the metrics)."""
  key = (id(task), max_examples)
  if key in _EVALUATORS:
    _EVALUATORS.move_to_end(key)
    return _EVALUATORS[key][1]
  evaluator = build_evaluator(task, max_examples)
  _EVALUATORS[key] = (task, evaluator)
  while len(_EVALUATORS) > _EVALUATORS_KEPT:
    _EVALUATORS.popitem(last=False)
  return evaluator


def build_evaluator(task: Task, max_examples: Optional[int] = None
                    ) -> Callable[..., dict[str, float]]:
  """Centralised evaluation of model weights on `task.test_data` (plain TF).

  The returned `run(weights, full=False)` uses the first `max_examples` test
  examples unless `full` (a fixed sample, so curves are comparable).
  """
  if task.test_data is None:
    return lambda weights, full=False: {}
  model = task.model_fn()
  sample = task.test_data
  if max_examples is not None:
    batch = next(iter(tf.nest.flatten(task.test_data.element_spec))).shape[0]
    sample = task.test_data.unbatch().take(max_examples).batch(batch or 100)

  def evaluate_on(dataset):
    @tf.function
    def evaluate(weights):
      local_training.assign_weights(model, weights)
      model.reset_metrics()
      for batch in dataset:
        model.forward_pass(batch, training=False)
      return model.report_local_unfinalized_metrics()
    return evaluate

  evaluators = {False: evaluate_on(sample), True: evaluate_on(task.test_data)}

  def run(weights, full: bool = False) -> dict[str, float]:
    unfinalized = evaluators[full](weights)
    # Keras finalizers are tf.functions that build a metric on each trace;
    # run their Python bodies eagerly instead.
    finalizers = model.metric_finalizers()
    return {name: float(np.asarray(
        getattr(finalizers[name], 'python_function', finalizers[name])(value)))
            for name, value in unfinalized.items()}

  return run
