"""The client loop, written once for every algorithm.

From the broadcast weights x_t a client runs, on its batched dataset,
`num_steps` optimiser steps (the dataset is repeated as needed: the K-steps
regime of papers 000/002/004) or `num_epochs` passes (set `num_steps = -1`):

    y_0 = x_t;  for k = 1..K:  g_k = grad f(y_{k-1}; batch_k) [+ correction(y_{k-1})]
                               y_k = ClientOpt(y_{k-1}, g_k)

and reports what the algorithms of this library are built from:

* `delta`       x_t - y_K (the FedAvg pseudo-gradient);
* `transform_state`  the final state of the step transforms (e.g.
                LocalUpdate's Theta-weighted sum of the raw gradients);
* `num_examples`, `num_steps` counts, and the model's metric state;
* `first_pass_examples` / `first_pass_complete`: the examples of the loop's
  first pass over the dataset, and whether that pass was whole; from them
  `examples_per_pass` gives the client's n_i (FedAvg's weight) without a
  second pass when it can, and counts it otherwise.

Algorithms change the local step through `StepTransform`s composed with
`chain` (like optax's; `core.step_transforms`): a `correction` of the gradient
(a proximal or control-variate term, clipping, weight decay) or a transform
that only watches the raw gradients (LocalUpdate's Theta-weighted sum),
instead of copying this loop.
Everything here runs inside a `tf.function`; it is plain TensorFlow that tests
can call without TFF.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.core.step_transforms import CorrectionFn, StepTransform, chain, correction

@dataclasses.dataclass
class LocalOutcome:
  delta: Any            # structure of trainable weights: x_t - y_K
  num_examples: tf.Tensor  # int64
  num_steps: tf.Tensor     # int32
  # The step transform's final state (() without a transform).
  transform_state: Any = ()
  # The client optimiser's state after the loop (MFL uploads its statistics).
  optimizer_state: Any = None
  # Examples in the loop's first pass over the dataset, and whether that pass
  # was complete (the dataset's cardinality known and the loop went past it).
  first_pass_examples: Optional[tf.Tensor] = None
  first_pass_complete: Optional[tf.Tensor] = None


def _loop_options() -> tf.data.Options:
  """No per-iterator dataset rewrites, autotuning or injected prefetching.

  Creating an iterator (MakeIterator) otherwise rewrites the dataset graph and
  starts autotuning: ~1.5 ms per client call, all of a tiny client's work. A
  client's pipeline is consumed by one sequential loop, so none of it helps.
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  options.experimental_optimization.apply_default_optimizations = False
  options.experimental_optimization.inject_prefetch = False
  return options


_LOOP_OPTIONS = _loop_options()


def fold(dataset: tf.data.Dataset, initial_state: Any,
         fn: Callable[[Any, Any], Any]) -> Any:
  """`dataset.reduce(initial_state, fn)`, as a while loop over an iterator.

  Same result, same order. `Dataset.reduce`'s kernel (ReduceDataset)
  instantiates `fn` as a new TensorFlow function, with graph optimisation and
  kernel creation, on EVERY execution (TF 2.14 releases its function handle
  cache at the end of each call). For a CNN training step that costs 40-100 ms
  per client per round, more than the steps themselves on small clients; it is
  what made every TFF round ~3x the pure-TF compute. Here the loop body is part
  of the enclosing function, instantiated once per computation and cached.
  Must be called inside a `tf.function` (as all client work is).

  Reads go through optionals (`IteratorGetNextAsOptional`, one read past the
  end). Synchronous reads of datasets of known size (`IteratorGetNextSync`)
  make the toy round ~10 % cheaper, but with them smoke runs on TFF's C++
  worker hang now and then, both inter-op threads blocked destroying the
  loop's iterators (docs/performance.md).
  """
  iterator = iter(dataset.with_options(_LOOP_OPTIONS))

  def cond(state, element):
    del state
    return element.has_value()

  def body(state, element):
    return fn(state, element.get_value()), iterator.get_next_as_optional()

  state, _ = tf.while_loop(cond, body, (initial_state, iterator.get_next_as_optional()))
  # A sequence point: TensorFlow runs stateful ops without resource inputs (this
  # one, and the next fold's iterator creation) in program order. Without it
  # two folds over one reshuffling dataset (a count, then training) created
  # their iterators in either order, so which pass got which shuffle varied
  # from run to run (Dataset.reduce, which it replaces, was ordered this way).
  with tf.control_dependencies(tf.nest.flatten(state)):
    tf.timestamp()
  return state


# ---------------------------------------------------------------- compiled loop

_COMPILED = contextvars.ContextVar('compiled_local_loops', default=False)


@contextlib.contextmanager
def compiled_loops(enabled: bool = True):
  """Client computations traced inside this scope (an algorithm BUILT inside
  it) run their local training loop XLA-compiled (`compiled_fold`)."""
  token = _COMPILED.set(enabled)
  try:
    yield
  finally:
    _COMPILED.reset(token)


def set_compiled_loops(enabled: bool) -> None:
  """`compiled_loops(enabled)` for the rest of this context (e.g. a worker
  process's initialiser, whose tasks then build)."""
  _COMPILED.set(enabled)


def compiling() -> bool:
  """Whether loops traced now are compiled (`compiled_loops`)."""
  return _COMPILED.get()


_UNKNOWN_LENGTH = 2**16  # batches read at most when the dataset's length is unknown


def _leading_size(batch, out_type=tf.int32):
  """Examples in a batch: the leading size of its first tensor."""
  return tf.shape(tf.nest.flatten(batch)[0], out_type=out_type)[0]


def compiled_fold(dataset: tf.data.Dataset, initial_state: Any,
                  fn: Callable[[Any, Any], Any], pass_dataset: tf.data.Dataset) -> Any:
  """`fold(dataset, initial_state, fn)` with the loop XLA-compiled.

  `dataset` is the loop's (`client_dataset`: passes of `pass_dataset`, or K
  of its batches). A step of a small model is a few dozen TensorFlow ops,
  each microseconds of executor work: ~0.13-0.25 ms a step of paper 003's
  logistic model, ~15-30 us compiled. XLA needs static shapes and no
  iterator, so the loop's batches are first read in ONE pass (`padded_batch`
  of all of them: tf.data's C++ loop, not a graph loop per batch), split into
  the batches of the largest size B and the short ones (a pass's last, all of
  one size r < B: every pass of `pass_dataset` batches alike), and the
  compiled loop takes batch i from its group, in the dataset's order: the
  batches `fold` takes, in its order. XLA caches the program per shape (the
  client's steps and last-batch size) and lane; `fn` must compile (no
  iterators, no stateful random ops). Results equal `fold`'s up to float
  rounding (XLA fuses and reorders arithmetic). docs/performance.md has what
  each choice below measured.
  """
  spec = dataset.element_spec
  # All batches as one element, zero-padded to the largest (padded_batch
  # reserves its batch size: the dataset's length when known, else up to
  # _UNKNOWN_LENGTH, checked below), then an empty one for an empty dataset.
  # No conditional around the compiled call: inside a branch it ran
  # uncompiled.
  length = dataset.cardinality()
  everything = tf.where(length > 0, length, tf.constant(_UNKNOWN_LENGTH, tf.int64))
  padded = dataset.padded_batch(everything)
  empty = tf.data.Dataset.from_tensors(tf.nest.map_structure(
      lambda s: tf.zeros([0, 0] + s.shape[2:], s.dtype), padded.element_spec))
  iterator = iter(padded.concatenate(empty).with_options(_LOOP_OPTIONS))
  batches = iterator.get_next()
  steps = tf.shape(tf.nest.flatten(batches)[0])[0]
  tf.debugging.assert_equal(
      tf.logical_and(length < 0, tf.cast(steps, tf.int64) >= _UNKNOWN_LENGTH), False,
      message=f'compiled local loop: over {_UNKNOWN_LENGTH} batches of unknown count')
  # Batch sizes: those of one pass over the pass's dataset (`pass_dataset`,
  # read AFTER the batches, so that a reshuffling dataset gives the loop the
  # order `fold` would), repeated: every pass of a dataset batches alike. A
  # map over every batch of the loop cost ~40 us a batch, as much as a step.
  with tf.control_dependencies([steps]):
    one_pass = pass_dataset.map(_leading_size).batch(_UNKNOWN_LENGTH).concatenate(
        tf.data.Dataset.from_tensors(tf.zeros([0], tf.int32))).take(1).get_single_element()
  tf.debugging.assert_equal(tf.logical_and(steps > 0, tf.equal(tf.size(one_pass), 0)), False,
                            message='compiled local loop: an empty pass but batches')
  sizes = tf.tile(one_pass, [steps // tf.maximum(tf.size(one_pass), 1) + 1])[:steps]
  largest = tf.reduce_max(tf.concat([sizes, [1]], 0))
  is_short = sizes < largest
  short_size = tf.reduce_max(tf.concat([tf.where(is_short, sizes, 0), [1]], 0))
  tf.debugging.assert_equal(  # (`==` on tensors is identity in TFF's graphs)
      tf.reduce_all(tf.logical_or(tf.equal(sizes, largest), tf.equal(sizes, short_size))),
      True, message='compiled local loop: batches of more than two sizes')
  index = tf.where(is_short, tf.cumsum(tf.cast(is_short, tf.int32), exclusive=True),
                   tf.cumsum(tf.cast(~is_short, tf.int32), exclusive=True))

  def group(mask, size):
    # The group's batches [n + 1, size, ...]: a row of zeros after them, so
    # that an empty group (whose branch the loop never takes) still compiles.
    def take(t):
      rows = tf.boolean_mask(t, mask)[:, :size]
      # (Narrower than `size` only for the empty dataset's [0, 0, ...].)
      widen = [[0, 0], [0, size - tf.shape(rows)[1]]] + [[0, 0]] * (t.shape.rank - 2)
      rows = tf.pad(rows, widen)
      filler = tf.zeros(tf.concat([[1, size], tf.shape(t)[2:]], 0), t.dtype)
      return tf.concat([rows, filler], 0)
    return tf.nest.map_structure(take, batches)

  # One entry more than there are steps: a slice of an empty array does not
  # compile, even in a loop that never runs.
  loop = _xla_loop(fn, spec)
  args = (group(~is_short, largest), group(is_short, short_size),
          tf.concat([is_short, [False]], 0), tf.concat([index, [0]], 0), steps, initial_state)
  state = loop(*args)
  if not _WARNED_CONVOLUTIONS and not tf.config.list_logical_devices('GPU'):
    _warn_if_convolutions_on_cpu(loop.get_concrete_function(*args))
  with tf.control_dependencies(tf.nest.flatten(state)):  # as `fold`'s sequence point
    tf.timestamp()
  return state


_WARNED_CONVOLUTIONS = []


def _warn_if_convolutions_on_cpu(function) -> None:
  """A warning, once a process, if the compiled loop `function` convolves
  (called only without a GPU): XLA's CPU convolutions made the EMNIST CNN's
  client steps ~20x slower here (0.93 s a 10-step client vs ~0.04 s;
  docs/performance.md)."""
  graph = function.graph.as_graph_def()
  ops = {node.op for node in graph.node}
  ops.update(node.op for f in graph.library.function for node in f.node_def)
  convolutions = sorted(op for op in ops if op.startswith(('Conv', 'DepthwiseConv')))
  if convolutions:
    _WARNED_CONVOLUTIONS.append(True)
    from absl import logging  # pylint: disable=g-import-not-at-top
    logging.warning(
        'compiled local loop (--compile_local_loop) with convolutions (%s) and no GPU: '
        "XLA's CPU convolutions ran the EMNIST CNN's client steps ~20x slower than "
        'the uncompiled loop here; drop the flag for this model', ', '.join(convolutions))


def _xla_loop(fn, spec):
  """The jit-compiled while loop over the steps of `compiled_fold`."""
  @tf.function(jit_compile=True, autograph=False)
  def loop(full, short, is_short, index, steps, state):
    def body(i, state):
      def batch(group):
        at = tf.minimum(index[i], tf.shape(tf.nest.flatten(group)[0])[0] - 1)
        return tf.nest.map_structure(
            lambda t, s: tf.ensure_shape(tf.gather(t, at), [None] + s.shape[1:]), group, spec)

      def step_if(run, one_batch, state):
        # A loop of 0 or 1 trips, not `tf.cond`: with a conditional in its
        # loop, the function ran uncompiled when called from a graph (1.5 ms
        # a step, 6x `fold`).
        return tf.while_loop(lambda j, _: j < run, lambda j, s: (j + 1, fn(s, one_batch)),
                             (tf.constant(0), state))[1]
      short_step = tf.cast(is_short[i], tf.int32)
      state = step_if(1 - short_step, batch(full), state)
      return i + 1, step_if(short_step, batch(short), state)
    _, state = tf.while_loop(lambda i, _: i < steps, body,
                             (tf.constant(0), state))
    return state
  return loop


def client_dataset(dataset: tf.data.Dataset, num_steps, num_epochs) -> tf.data.Dataset:
  """K steps (repeat forever, take K) or E epochs (repeat E, take all)."""
  return dataset.repeat(tf.cast(num_epochs, tf.int64)).take(
      tf.cast(num_steps, tf.int64))


def all_finite(structure) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t))
                        for t in tf.nest.flatten(structure)])


def batch_examples(output: tff.learning.models.BatchOutput) -> tf.Tensor:
  """Examples in the batch of a `forward_pass` output (int64): its
  `num_examples`, or the leading size of its predictions when the model
  does not report one."""
  if output.num_examples is None:
    return tf.shape(output.predictions, out_type=tf.int64)[0]
  return tf.cast(output.num_examples, tf.int64)


def assign_weights(model: tff.learning.models.VariableModel, weights) -> None:
  """Assigns a `ModelWeights`-like structure to the model's variables."""
  variables = tff.learning.models.ModelWeights.from_model(model)
  for v, w in zip(tf.nest.flatten(variables), tf.nest.flatten(weights)):
    v.assign(w)


def run_local_training(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    optimizer_hparams: Optional[Any],
    initial_weights: Any,
    dataset: tf.data.Dataset,
    num_steps,
    num_epochs,
    *,
    correction_fn: Optional[CorrectionFn] = None,
    transform: Optional[StepTransform] = None,
    optimizer_state: Optional[Any] = None,
) -> LocalOutcome:
  """Runs the local loop on `model` (a VariableModel, reused across calls).

  Args:
    model: the client's model; its variables are overwritten with
      `initial_weights` first. Its metrics accumulate over the loop.
    optimizer: a `tff.learning.optimizers.Optimizer`, initialised here.
    optimizer_hparams: hparams set into the fresh optimizer state (e.g. the
      round's learning rate), or None for the optimizer's own.
    initial_weights: `tff.learning.models.ModelWeights` structure (x_t).
    dataset: the client's batched dataset (one epoch).
    num_steps: int scalar; -1 for "all batches of `num_epochs` epochs".
    num_epochs: int scalar; -1 for "repeat forever" (with `num_steps` > 0).
    correction_fn: optional `(trainable_weights, grads) -> grads`, applied
      after `transform` (shorthand for `chain(transform, correction(correction_fn))`,
      whose state is the pair of their states).
    transform: optional `StepTransform` of each step's raw gradient; its final
      state is the outcome's `transform_state`.
    optimizer_state: optional state to start the optimiser from (e.g. global
      statistics downloaded from the server) instead of `optimizer.initialize`.
  """
  assign_weights(model, initial_weights)
  trainable = model.trainable_variables
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  opt_state = (optimizer.initialize(specs) if optimizer_state is None
               else optimizer_state)
  if optimizer_hparams is not None:
    opt_state = optimizer.set_hparams(opt_state, optimizer_hparams)
  transform = chain(transform, None if correction_fn is None else correction(correction_fn))
  # Batches in one pass (< 0: unknown or infinite); the first pass's examples
  # are summed on the way (see `examples_per_pass`).
  pass_batches = dataset.cardinality()

  # One fused loop (`fold`: a while loop over an iterator). An autograph `for`
  # over the dataset measured ~1.4x slower, `Dataset.reduce` ~1.6x (per call).
  compiled = compiling()
  forward_pass = model.forward_pass
  if compiled:
    # The model's own function traced into the compiled loop, not called as a
    # function: XLA then took the data and the variables as compile-time
    # constants, compiling anew for every call.
    forward_pass = getattr(forward_pass, 'python_function', forward_pass)

  def step(carry, batch):
    opt_state, transform_state, num_examples, first_pass, steps = carry
    with tf.GradientTape() as tape:
      output = forward_pass(batch, training=True)
    grads = tuple(tape.gradient(output.loss, trainable))
    if transform is not None:
      grads, transform_state = transform.update(grads, tuple(trainable),
                                                transform_state, steps)
    opt_state, new_weights = optimizer.next(opt_state, tuple(trainable), grads)
    for v, w in zip(trainable, new_weights):
      v.assign(w)
    n = batch_examples(output)
    first_pass += tf.where(tf.cast(steps, tf.int64) < pass_batches, n, 0)
    return opt_state, transform_state, num_examples + n, first_pass, steps + 1

  zero = tf.constant(0, tf.int64)
  transform_state = () if transform is None else transform.init(trainable)
  loop = functools.partial(compiled_fold, pass_dataset=dataset) if compiled else fold
  opt_state, transform_state, num_examples, first_pass, steps = loop(
      client_dataset(dataset, num_steps, num_epochs),
      (opt_state, transform_state, zero, zero, tf.constant(0, tf.int32)),
      step)
  first_pass_complete = tf.logical_and(
      pass_batches >= 0, tf.cast(steps, tf.int64) >= pass_batches)

  delta = tf.nest.map_structure(tf.subtract, initial_weights.trainable,
                                tf.nest.pack_sequence_as(
                                    initial_weights.trainable, list(trainable)))
  return LocalOutcome(delta=delta, num_examples=num_examples, num_steps=steps,
                      transform_state=transform_state, optimizer_state=opt_state,
                      first_pass_examples=first_pass,
                      first_pass_complete=first_pass_complete)


def run_scheduled(model: tff.learning.models.VariableModel,
                  optimizer: tff.learning.optimizers.Optimizer, hparams: Any,
                  initial_weights: Any, dataset: tf.data.Dataset, **options) -> LocalOutcome:
  """`run_local_training` under a round's broadcast hyperparameters (a
  `ClientSchedule`'s: the optimiser's learning rate set to `learning_rate`,
  then `num_steps` steps or `num_epochs` passes)."""
  return run_local_training(
      model, optimizer, collections.OrderedDict(learning_rate=hparams['learning_rate']),
      initial_weights, dataset, hparams['num_steps'], hparams['num_epochs'], **options)


def mean_loss(model: tff.learning.models.VariableModel, weights: Any,
              dataset: tf.data.Dataset):
  """Example-weighted mean loss of `weights` over one pass of `dataset`.

  Leaves the model's metrics reset, so training metrics that follow only count
  training. Returns (mean loss float32, number of examples int64).
  """
  assign_weights(model, weights)

  def add(carry, batch):
    total, count = carry
    output = model.forward_pass(batch, training=False)
    n = batch_examples(output)
    return (total + tf.cast(output.loss, tf.float64) * tf.cast(n, tf.float64),
            count + n)

  total, count = fold(
      dataset, (tf.constant(0.0, tf.float64), tf.constant(0, tf.int64)), add)
  model.reset_metrics()
  return (tf.cast(tf.math.divide_no_nan(total, tf.cast(count, tf.float64)),
                  tf.float32), count)


def examples_per_pass(dataset: tf.data.Dataset, outcome: LocalOutcome) -> tf.Tensor:
  """Examples in one pass of `dataset` (int64): `outcome`'s first-pass count
  when the loop covered a whole pass, else a counting pass over `dataset`.

  The counting pass cost ~1.2 ms per client (an iterator and a read of every
  batch), a tenth of a 10-step CNN client; when K >= one epoch (or in epochs
  mode) the training loop has already seen every example once.
  """
  if outcome.first_pass_complete is None:
    return count_examples(dataset)
  return tf.cond(outcome.first_pass_complete,
                 lambda: outcome.first_pass_examples,
                 lambda: count_examples(dataset))


def count_target_tokens(dataset: tf.data.Dataset) -> tf.Tensor:
  """Non-padding target tokens (!= 0) in one pass of a batched (x, y) or
  {'x', 'y'} dataset (float32): Reddi et al.'s `num_tokens` client weight."""
  def add(count, batch):
    targets = batch['y'] if isinstance(batch, dict) else batch[1]
    return count + tf.reduce_sum(tf.cast(tf.not_equal(targets, 0), tf.float32))
  return fold(dataset, tf.constant(0.0), add)


def count_examples(dataset: tf.data.Dataset) -> tf.Tensor:
  """Examples in one pass of a batched dataset (int64), without a model."""
  def add(count, batch):
    return count + _leading_size(batch, tf.int64)
  return fold(dataset, tf.constant(0, tf.int64), add)
