"""What every round builder shares, written once.

The three kinds of round in this library (`client_work.build_client_work`:
a schedule and the shared local loop; `global_statistics`: plus statistics
the server keeps and clients download; `stateful_process`: plus a state per
client) differ in what a client downloads and uploads and in what the server
does with it. They share, from here:

* `model_types`: the model's weights and data types and its metrics'
  aggregation, read off a throwaway model;
* `run_client`: the per-client body (a fresh model, the algorithm's client
  function in one `tf.function`), the way FedJAX's `for_each_client` runs
  an algorithm's client init/step/final;
* `drop_if_non_finite`: a diverged client contributes nothing (TFF's
  convention and its `zero_all_if_any_non_finite`): its upload is zeroed,
  its weight is 0, it keeps its old state and its metrics are dropped;
* `measurements`: the per-round measurements every kind reports.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple, Optional

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning import tensor_utils

from tff_algos.core import local_training


class ModelTypes(NamedTuple):
  weights: tff.Type   # tff.learning.models.ModelWeights of the model
  data: tff.Type      # a client's dataset
  # federated unfinalized metrics -> the finalized metrics at the server
  aggregate_metrics: Callable[[Any], Any]


def model_types(model_fn: Callable[[], tff.learning.models.VariableModel]) -> ModelTypes:
  """The types of a model from `model_fn`, built once in a throwaway graph."""
  with tf.Graph().as_default():
    whimsy = model_fn()
    aggregate_metrics = tff.learning.metrics.sum_then_finalize(
        whimsy.metric_finalizers())
  return ModelTypes(tff.learning.models.weights_type_from_model(whimsy),
                    tff.SequenceType(tff.types.tensorflow_to_type(whimsy.input_spec)),
                    aggregate_metrics)


class ClientStep(NamedTuple):
  """What an algorithm's client function returns."""
  upload: Any          # structure sent to the server
  new_state: Any       # the client's state after the round (stays on the client)
  outcome: local_training.LocalOutcome
  device_model: Any = None  # the device's model after the round (trainable list)


def run_client(model_fn, client_fn: Callable[..., Any], *args):
  """`client_fn(model, *args)` on a fresh model, traced as one `tf.function`
  (call it from the body of a `tff.tensorflow.computation`).

  Traced without AutoGraph: it converted every function a client calls (the
  local loop, the optimiser, the model), ~1.1 of a FedAvg build's 2.1 s on the
  quadratic toy, and the library's client code needs none of it (`tf.cond`,
  `local_training.fold`). A client function whose trace fails without it (a
  Python `if` on a tensor, `for batch in dataset`, `range(tensor)`) is traced
  again with AutoGraph, with a warning (`autograph_fallbacks` counts them); if
  that fails too, its error is raised.
  """
  model = model_fn()

  def train(*args):
    return client_fn(model, *args)
  try:
    return tf.function(train, autograph=False)(*args)
  except Exception as e:  # pylint: disable=broad-except
    first_error = e
  autograph_fallbacks.append(getattr(client_fn, '__qualname__', repr(client_fn)))
  logging.warning('%s could not be traced without AutoGraph (%s: %s); it is traced with '
                  'AutoGraph (~1 s more to build); tf.cond and local_training.fold '
                  'avoid that.', autograph_fallbacks[-1], type(first_error).__name__,
                  str(first_error).splitlines()[0][:120] if str(first_error) else '')
  return tf.function(train, autograph=True)(*args)


autograph_fallbacks: list[str] = []  # client functions that needed AutoGraph


class Kept(NamedTuple):
  """A client's contribution after `drop_if_non_finite`."""
  upload: Any
  new_state: Any
  weight: tf.Tensor      # float32: its weight, or 0 if dropped
  stats: Any             # num_steps, [finite (float32)], non_finite (int32)


def _not_in(upload, *structures) -> list:
  """The tensors of `structures` not in `upload`, each once (an upload often
  is the delta itself)."""
  seen, tensors = {id(t) for t in tf.nest.flatten(upload)}, []
  for t in tf.nest.flatten(structures):
    if id(t) not in seen:
      seen.add(id(t))
      tensors.append(t)
  return tensors


def drop_if_non_finite(model: tff.learning.models.VariableModel, step: ClientStep,
                       old_state: Any = (),
                       weight_fn: Optional[Callable[[], tf.Tensor]] = None,
                       count_finite: bool = False) -> Kept:
  """Keeps a client's step, or drops it if its upload, its local model delta
  or its new state holds a NaN or Inf.

  Kept: the step's upload and new state, weight `weight_fn()` (1 without one).
  Dropped: the upload zeroed, `old_state`, weight 0, the model's metrics reset.
  Must run inside a `tf.function`.
  """
  (upload, _), non_finite = tensor_utils.zero_all_if_any_non_finite(
      (step.upload, _not_in(step.upload, step.outcome.delta, step.new_state)))
  finite = tf.equal(non_finite, 0)

  def kept():
    return step.new_state, (tf.constant(1.0) if weight_fn is None else weight_fn())

  def dropped():
    model.reset_metrics()
    return old_state, tf.constant(0.0)
  new_state, weight = tf.cond(finite, kept, dropped)
  stats = collections.OrderedDict(num_steps=step.outcome.num_steps)
  if count_finite:
    stats['finite'] = tf.cast(finite, tf.float32)
  stats['non_finite'] = tf.cast(tf.logical_not(finite), tf.int32)
  return Kept(upload, new_state, weight, stats)


def examples_weight(dataset: tf.data.Dataset, outcome: local_training.LocalOutcome):
  """A `weight_fn` weighting a client by its dataset size n_i.

  n_i (paper 000, Alg. 1), not the examples processed: with K steps every
  client processes ~K*B examples whatever its size. (Per epoch the two are
  proportional, so TFF's FedAvg weights agree.)
  """
  return lambda: tf.cast(local_training.examples_per_pass(dataset, outcome), tf.float32)


def tokens_weight(dataset: tf.data.Dataset, outcome: local_training.LocalOutcome):
  """A `weight_fn` weighting a client by the non-padding target tokens of one
  pass over its data (Reddi et al.'s code for Shakespeare and StackOverflow
  NWP: `client_weight_fn` = the `num_tokens` metric of its one local epoch)."""
  del outcome
  return lambda: local_training.count_target_tokens(dataset)


# Client weightings of `client_work.build_client_work`: TFF's two, and tokens.
TOKENS = 'tokens'


def measurements(aggregate_metrics, model_metrics, stats, client_learning_rate,
                 **more) -> collections.OrderedDict:
  """The round's measurements (federated values at the server): the model's
  training metrics, `client_steps` (local steps taken by the cohort),
  `non_finite_clients`, `client_learning_rate`, then `more` in order."""
  result = collections.OrderedDict(
      train=aggregate_metrics(model_metrics),
      client_steps=tff.federated_sum(stats.num_steps),
      non_finite_clients=tff.federated_sum(stats.non_finite),
      client_learning_rate=client_learning_rate)
  result.update(more)
  return result
