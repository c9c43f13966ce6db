"""The shared local loop's dataset fold (`local_training.fold`).

`fold` replaced `Dataset.reduce` (which re-created its function on every call):
it must give reduce's result in reduce's order, and folds over one reshuffling
dataset must see its shuffles in program order, every time.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_algos.core import local_training

from tff_algos.core import step_transforms


def digits_of(state, x):
  return state * 10 + x


def test_fold_equals_dataset_reduce_in_order():
  ds = tf.data.Dataset.range(1, 8).batch(3)  # batches [1 2 3] [4 5 6] [7]

  @tf.function
  def both(ds):
    add = lambda s, b: digits_of(s, tf.reduce_sum(b))
    return (local_training.fold(ds, tf.constant(0, tf.int64), add),
            ds.reduce(tf.constant(0, tf.int64), add))

  folded, reduced = both(ds)
  assert int(folded) == int(reduced) == 6 * 100 + 15 * 10 + 7
  # Structures as state; an empty dataset leaves the initial state.
  empty = tf.data.Dataset.range(0)
  pair = tf.function(lambda d: local_training.fold(
      d, (tf.constant(1, tf.int64), tf.constant(2.0)), lambda s, x: (s[0] + x, s[1])))(empty)
  assert int(pair[0]) == 1 and float(pair[1]) == 2.0


def test_two_folds_over_a_reshuffling_dataset_see_its_shuffles_in_program_order():
  def fresh():
    return tf.data.Dataset.range(10).shuffle(10, seed=5, reshuffle_each_iteration=True)

  eager = fresh()
  first, second = [int(''.join(str(int(x)) for x in eager)) for _ in range(2)]
  assert first != second

  @tf.function
  def count_then_train(ds):  # e.g. FedDyn: count the examples, then train
    a = local_training.fold(ds, tf.constant(0, tf.int64), digits_of)
    b = local_training.fold(ds, tf.constant(0, tf.int64), digits_of)
    return a, b

  # Without a sequence point between the folds, the two iterators were created
  # in either order: measured, calls 2 and 3 got the shuffles swapped.
  for _ in range(5):
    a, b = count_then_train(fresh())
    assert (int(a), int(b)) == (first, second)


def test_client_dataset_steps_and_epochs():
  ds = tf.data.Dataset.range(5).batch(2)  # 3 batches per epoch

  @tf.function
  def steps(k, e):
    return local_training.fold(local_training.client_dataset(ds, k, e),
                               tf.constant(0, tf.int64), lambda s, b: s + 1)

  assert int(steps(7, -1)) == 7   # K steps: repeats as needed
  assert int(steps(-1, 2)) == 6   # E epochs: all batches of 2 passes
  assert int(steps(0, -1)) == 0
  np.testing.assert_equal(int(local_training.count_examples(ds)), 5)


def _linear_model():
  import collections
  import tensorflow_federated as tff
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 1], tf.float32),
                                 y=tf.TensorSpec([None, 1], tf.float32))
  keras = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
  return tff.learning.models.from_keras_model(
      keras, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)


def test_examples_per_pass_from_the_loop_or_a_counting_pass():
  """n_i (FedAvg's weight) is the same whether the loop saw a whole first pass
  (read off the loop) or not (K < batches, unknown cardinality: counted)."""
  import tensorflow_federated as tff
  x = np.arange(7, dtype=np.float32).reshape(7, 1)
  batched = tf.data.Dataset.from_tensor_slices(dict(x=x, y=x)).batch(3)  # 3 batches, 7 examples
  filtered = tf.data.Dataset.from_tensor_slices(dict(x=x, y=x)).filter(
      lambda e: e['x'][0] < 5.0).batch(3)  # cardinality unknown, 5 examples
  model = _linear_model()
  init = tf.nest.map_structure(
      lambda v: v.read_value(), tff.learning.models.ModelWeights.from_model(model))
  opt = tff.learning.optimizers.build_sgdm(0.01)

  @tf.function
  def run(ds, k, e):
    outcome = local_training.run_local_training(model, opt, None, init, ds, k, e)
    return (outcome.first_pass_complete, local_training.examples_per_pass(ds, outcome),
            outcome.num_examples)

  for ds, k, e, from_loop, n, processed in [
      (batched, 3, -1, True, 7, 7),     # K = one epoch
      (batched, 5, -1, True, 7, 7 + 6),  # K > one epoch: first pass only
      (batched, 2, -1, False, 7, 6),    # K < one epoch: counted
      (batched, -1, 2, True, 7, 14),    # epochs mode
      (filtered, 4, -1, False, 5, 10),  # cardinality unknown (2 batches): counted
  ]:
    complete, examples, num_examples = run(ds, k, e)
    assert bool(complete) == from_loop, (k, e)
    assert int(examples) == n, (k, e)
    assert int(num_examples) == processed, (k, e)


def test_clip_then_decay_clips_the_objective_gradient_then_adds_the_decay():
  grads = [tf.constant([3.0, 0.0]), tf.constant([4.0])]  # global norm 5
  weights = [tf.constant([1.0, 2.0]), tf.constant([-1.0])]
  out = step_transforms.clip_then_decay(grads, weights, clip_norm=1.0, weight_decay=0.5)
  np.testing.assert_allclose(out[0], [0.6 + 0.5, 0.0 + 1.0], rtol=1e-6)
  np.testing.assert_allclose(out[1], [0.8 - 0.5], rtol=1e-6)
  # Under the norm: untouched; a tensor decay (FedDyn's alpha_k + lambda) works too.
  out = step_transforms.clip_then_decay(grads, weights, 10.0, tf.constant(0.0))
  np.testing.assert_allclose(out[0], [3.0, 0.0])


def test_regularized_keeps_a_default_run_s_correction_itself():
  def correction(initial_weights):
    return lambda weights, grads: grads
  assert step_transforms.regularized(correction) is correction
  assert step_transforms.regularized(None) is None
  with_clip = step_transforms.regularized(correction, clip_norm=1.0)
  assert with_clip is not correction
  out = with_clip(None)([tf.constant(1.0)], [tf.constant(4.0)])
  np.testing.assert_allclose(out[0], 1.0)


def test_fold_reads_any_dataset_through_optionals_and_equals_reduce():
  """fold gives reduce's result in reduce's order, for datasets that know their
  size and ones that do not (a `filter`); empty ones leave the initial state.
  Its one loop reads through optionals: synchronous `IteratorGetNextSync`
  reads of sized datasets hang now and then on TFF's C++ worker
  (docs/performance.md)."""
  add = lambda s, b: digits_of(s, tf.reduce_sum(b))
  sized = tf.data.Dataset.range(1, 8).batch(3)
  unsized = tf.data.Dataset.range(1, 10).filter(lambda x: x < 8).batch(3)
  assert int(sized.cardinality()) == 3
  assert int(unsized.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)

  @tf.function
  def both(ds):
    return (local_training.fold(ds, tf.constant(0, tf.int64), add),
            ds.reduce(tf.constant(0, tf.int64), add))

  for ds in (sized, unsized, sized.take(0), unsized.filter(lambda b: False)):
    folded, reduced = both(ds)
    assert int(folded) == int(reduced), ds
  assert int(both(unsized)[0]) == 6 * 100 + 15 * 10 + 7
  # Elements that are structures, as clients' batches are.
  pairs = tf.data.Dataset.from_tensor_slices(
      dict(x=np.arange(6.0, dtype=np.float32), y=np.arange(6))).batch(4)
  for ds in (pairs, pairs.filter(lambda e: True)):
    total = tf.function(lambda d: local_training.fold(
        d, (tf.constant(0.0), tf.constant(0, tf.int64)),
        lambda s, e: (s[0] + tf.reduce_sum(e['x']), s[1] + tf.reduce_sum(e['y']))))(ds)
    assert (float(total[0]), int(total[1])) == (15.0, 15)

  # The reads the loop makes: the graph's while body.
  graph_def = both.get_concrete_function(sized).graph.as_graph_def()
  bodies = {f.signature.name: {n.op for n in f.node_def} for f in graph_def.library.function
            if 'while_body' in f.signature.name}
  reads = sorted(tuple(sorted(op for op in ops if 'GetNext' in op)) for ops in bodies.values()
                 if any('GetNext' in op for op in ops))
  assert reads == [('IteratorGetNextAsOptional',)]


def test_a_sized_dataset_that_ends_early_is_an_error_not_a_short_loop():
  """A dataset whose cardinality overstates its elements (an `assert_cardinality`
  that does not hold) stops the call with TensorFlow's error."""
  wrong = tf.data.Dataset.range(3).apply(tf.data.experimental.assert_cardinality(5))
  assert int(wrong.cardinality()) == 5
  with pytest.raises(tf.errors.OpError):
    tf.function(lambda d: local_training.fold(d, tf.constant(0, tf.int64), tf.add))(wrong)


# ------------------------------------------------------- compiled_fold (XLA)


def _compiled(ds, state, fn):
  return local_training.compiled_fold(ds, state, fn, pass_dataset=ds)


def test_compiled_fold_takes_folds_batches_in_folds_order():
  """Full and short batches, K steps across passes, E passes of a reshuffling
  dataset, datasets of unknown size, structures and empty datasets: the XLA
  loop folds the batches `fold` folds, in its order (each step weighs its
  batch by its position, so a swap changes the result)."""
  def weigh(state, batch):
    total, step = state
    x = tf.cast(tf.nest.flatten(batch)[0], tf.float64)
    return total + tf.reduce_sum(x) * tf.cast(step + 1, tf.float64) ** 2, step + 1

  reshuffled = lambda: tf.data.Dataset.range(23).shuffle(23, seed=4).batch(5)  # 5,5,5,5,3
  unsized = lambda: tf.data.Dataset.range(30).filter(lambda x: x % 4 > 0).batch(4)
  pairs = lambda: tf.data.Dataset.from_tensor_slices(
      dict(x=np.arange(11.0, dtype=np.float32), y=np.arange(11))).batch(3)
  cases = [(reshuffled, -1, 3), (reshuffled, 7, -1),
           (lambda: tf.data.Dataset.range(20).batch(5), -1, 2), (unsized, -1, 2),
           (pairs, 9, -1), (lambda: reshuffled().take(0), -1, 2),
           (lambda: unsized().filter(lambda b: False), -1, 1)]

  for make, steps, epochs in cases:
    def loop(compiled):
      @tf.function
      def run():  # a fresh dataset: its shuffles start over
        ds = make()
        start = (tf.constant(0.0, tf.float64), tf.constant(0))
        if compiled:
          return local_training.compiled_fold(
              local_training.client_dataset(ds, steps, epochs), start, weigh, pass_dataset=ds)
        return local_training.fold(local_training.client_dataset(ds, steps, epochs), start,
                                   weigh)
      return run()
    (a, n), (b, m) = loop(False), loop(True)
    assert int(n) == int(m), (steps, epochs)
    assert float(a) == float(b), (steps, epochs)


def test_compiled_training_loop_sees_the_shuffle_fold_would():
  """Count, then train: the compiled loop (which reads the dataset's batch
  sizes in one more pass, after its batches) trains on the second shuffle, as
  `fold` does."""
  def fresh():
    return tf.data.Dataset.range(10).shuffle(10, seed=5, reshuffle_each_iteration=True).batch(4)

  @tf.function
  def count_then_train(ds, compiled):
    count = local_training.fold(ds, tf.constant(0, tf.int64), lambda s, b: s + 1)
    with tf.control_dependencies([count]):
      loop = _compiled if compiled else local_training.fold
      return loop(ds, tf.constant(0, tf.int64), lambda s, b: digits_of(s, b[0]))

  for _ in range(3):
    assert int(count_then_train(fresh(), True)) == int(count_then_train(fresh(), False))


def test_compiled_fold_refuses_batches_of_three_sizes():
  ragged = tf.data.Dataset.range(6).batch(3).concatenate(tf.data.Dataset.range(5).batch(2))
  with pytest.raises(tf.errors.InvalidArgumentError, match='more than two sizes'):
    tf.function(lambda d: _compiled(d, tf.constant(0, tf.int64),
                                    lambda s, b: s + tf.reduce_sum(b)))(ragged)


def test_compiled_local_training_equals_the_loop():
  """`run_local_training` of a model built inside `compiled_loops` (the step's
  optimiser, clipping, weight decay and a proximal correction XLA-compiled)
  gives the loop's outcome: the same steps, examples and first pass, the delta
  to float rounding."""
  from tasks import stacked_logistic
  import tensorflow_federated as tff
  rng = np.random.default_rng(0)
  x = rng.normal(size=(37, 6)).astype(np.float32)
  y = rng.integers(0, 3, 37).astype(np.int32)
  optimizer = tff.learning.optimizers.build_sgdm(0.3, momentum=0.5)
  correction = step_transforms.regularized(
      lambda x_t: (lambda w, g: [gg + 0.1 * (ww - xx) for gg, ww, xx
                                 in zip(g, w, x_t.trainable)]), 1e-3, 1.0)

  def outcome(compiled, steps, epochs):
    model = stacked_logistic.StackedLogisticModel(2, 6, 3)

    @tf.function
    def train(x, y):
      ds = tf.data.Dataset.from_tensor_slices(dict(x=x, y=y)).shuffle(
          37, seed=1).batch(5)
      start = tff.learning.models.ModelWeights(
          trainable=[tf.fill([2, 6, 3], 0.1), tf.zeros([2, 1, 3])], non_trainable=[])
      with local_training.compiled_loops(compiled):
        out = local_training.run_local_training(model, optimizer, None, start, ds, steps,
                                                epochs, correction_fn=correction(start))
      return (out.delta, out.num_examples, out.num_steps, out.first_pass_examples,
              out.first_pass_complete, model.report_local_unfinalized_metrics())
    return train(x, y)

  for steps, epochs in ((-1, 3), (11, -1), (4, -1)):
    loop, xla = outcome(False, steps, epochs), outcome(True, steps, epochs)
    for a, b in zip(tf.nest.flatten(loop[0]), tf.nest.flatten(xla[0])):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert [int(v) for v in loop[1:5]] == [int(v) for v in xla[1:5]], (steps, epochs)
    for a, b in zip(tf.nest.flatten(loop[5]), tf.nest.flatten(xla[5])):  # the metrics
      np.testing.assert_allclose(b, a, rtol=1e-5)


def _compiling(_):
  return local_training.compiling()


def test_worker_processes_build_compiled_loops_when_asked():
  """`--compile_local_loop` reaches `map_in_processes`' workers (the grid's and
  table6's): their builds compile, and only when asked. (A scope entered in
  the worker's initialiser and then dropped had reset itself at once.)"""
  from experiments.lib import runtime_flags
  base = dict(backend='inprocess', workers=None, concurrent_clients=1)
  for asked in (True, False):
    seen = list(runtime_flags.map_in_processes(
        _compiling, range(2), 2, dict(base, compile_local_loop=asked)))
    assert seen == [asked, asked]


def test_compiled_fold_refuses_a_pass_without_batches_when_the_loop_has_some():
  """The batch sizes come from one pass of `pass_dataset`: an empty one
  beside a loop with batches is an error, not a loop of guessed sizes."""
  with pytest.raises(tf.errors.InvalidArgumentError, match='an empty pass but batches'):
    tf.function(lambda d: local_training.compiled_fold(
        d, tf.constant(0, tf.int64), lambda s, b: s + tf.reduce_sum(b),
        pass_dataset=d.take(0)))(tf.data.Dataset.range(6).batch(3))


def test_table6s_compiled_default_holds_on_the_in_process_backend_only():
  """A binary's default (table6: on) does not compile on --backend=cpp,
  where compiled loops do not run; the flag given there is refused."""
  from absl import flags
  from experiments.lib import runtime_flags
  FLAGS = flags.FLAGS
  FLAGS.unparse_flags()
  try:
    FLAGS(['x'])
    assert runtime_flags.compile_local_loop(default=True) is True
    assert runtime_flags.values(default_compile=True)['compile_local_loop'] is True
    FLAGS.unparse_flags()
    FLAGS(['x', '--backend=cpp'])
    assert runtime_flags.compile_local_loop(default=True) is False
    assert runtime_flags.values(default_compile=True)['compile_local_loop'] is False
    FLAGS.unparse_flags()
    FLAGS(['x', '--backend=cpp', '--compile_local_loop'])
    with pytest.raises(ValueError, match='in-process backend only'):
      runtime_flags.check()
    FLAGS.unparse_flags()
    FLAGS(['x', '--nocompile_local_loop'])
    assert runtime_flags.compile_local_loop(default=True) is False
  finally:
    FLAGS.unparse_flags()


def test_a_compiled_loop_with_convolutions_on_a_cpu_warns_once(caplog, monkeypatch):
  """XLA's CPU convolutions ran the EMNIST CNN ~20x slower than the plain
  loop: a compiled loop whose step convolves, with no GPU, says so once; one
  without convolutions says nothing."""
  if tf.config.list_logical_devices('GPU'):
    pytest.skip('the warning is for CPU-only machines')
  monkeypatch.setattr(local_training, '_WARNED_CONVOLUTIONS', [])
  kernel = tf.ones([3, 3, 1, 2])

  def conv_step(state, batch):
    return state + tf.reduce_sum(tf.nn.conv2d(batch, kernel, 1, 'SAME'))

  def dense_step(state, batch):
    return state + tf.reduce_sum(batch)

  images = tf.data.Dataset.from_tensor_slices(tf.ones([6, 4, 4, 1])).batch(2)
  caplog.set_level('WARNING')
  for step in (dense_step, conv_step, conv_step):
    out = tf.function(lambda d, step=step: _compiled(d, tf.constant(0.0), step))(images)
    assert float(out) > 0
  warned = [r.getMessage() for r in caplog.records if 'convolutions' in r.getMessage()]
  assert len(warned) == 1 and 'Conv2D' in warned[0] and 'drop the flag' in warned[0]
