"""The pieces every round builder shares: step transforms chained like optax's,
and the non-finite drop (`core.rounds.drop_if_non_finite`)."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from least_squares import Problem
from tff_algos.core import local_training
from tff_algos.core import step_transforms
from tff_algos.core import rounds


def _counting(scale):
  """A transform multiplying the gradient by `scale` and counting its steps."""
  def update(grads, weights, count, step):
    del weights, step
    return tuple(scale * g for g in grads), count + 1
  return step_transforms.StepTransform(lambda trainable: tf.constant(0), update)


def test_chain_applies_transforms_in_order_each_with_its_own_state():
  add_weights = step_transforms.correction(
      lambda weights, grads: [g + w for g, w in zip(grads, weights)])
  chained = step_transforms.chain(_counting(2.0), None, add_weights, _counting(3.0))
  state = chained.init(())
  grads, state = chained.update((tf.constant(1.0),), (tf.constant(10.0),), state, 0)
  assert float(grads[0]) == (1.0 * 2.0 + 10.0) * 3.0
  grads, state = chained.update(grads, (tf.constant(0.0),), state, 1)
  assert int(state[0]) == 2 and state[1] == () and int(state[2]) == 2
  assert step_transforms.chain(None, None) is None
  single = _counting(1.0)
  assert step_transforms.chain(None, single) is single


def test_the_loop_returns_the_transform_state_and_applies_corrections_after_it():
  """A transform sees the raw gradient; `correction_fn` changes the step after it."""
  problem = Problem(num_clients=1, n=4, dim=2)
  model = problem.model_fn()
  w0 = np.array([0.5, -1.0], np.float32)
  optimizer = tff.learning.optimizers.build_sgdm(0.1)

  def record_raw(grads, weights, seen, step):
    del weights, step
    return grads, seen + grads[0]

  record = step_transforms.StepTransform(lambda trainable: tf.zeros([2]), record_raw)

  @tf.function
  def run():
    outcome = local_training.run_local_training(
        model, optimizer, None, problem.weights(w0), problem.dataset(0), 1, -1,
        transform=record, correction_fn=lambda w, g: [x * 0.0 for x in g])
    return outcome.transform_state, outcome.delta

  (seen, correction_state), delta = run()   # the chain's states, in order
  assert correction_state == ()
  np.testing.assert_allclose(seen, problem.grad(0, w0), rtol=1e-5)
  np.testing.assert_allclose(delta[0], [0.0, 0.0])   # the corrected step is 0


def _drop(upload, new_state, old_state=(), weight=None, delta=(1.0, 2.0)):
  problem = Problem(num_clients=1, n=4, dim=2)
  model = problem.model_fn()

  @tf.function
  def run():
    model.forward_pass(next(iter(problem.dataset(0))))  # metrics to drop
    outcome = local_training.LocalOutcome(
        delta=[tf.constant(delta)], num_examples=tf.constant(4, tf.int64),
        num_steps=tf.constant(3))
    step = rounds.ClientStep(upload=upload, new_state=new_state, outcome=outcome)
    kept = rounds.drop_if_non_finite(
        model, step, old_state=old_state, count_finite=True,
        weight_fn=None if weight is None else (lambda: tf.constant(weight)))
    return kept, model.report_local_unfinalized_metrics()
  return run()


def test_a_finite_client_is_kept_with_its_weight():
  kept, metrics = _drop([tf.constant([1.0, -1.0])], [tf.constant(5.0)],
                        old_state=[tf.constant(0.0)], weight=7.0)
  np.testing.assert_allclose(kept.upload[0], [1.0, -1.0])
  assert float(kept.new_state[0]) == 5.0 and float(kept.weight) == 7.0
  assert int(kept.stats['num_steps']) == 3
  assert float(kept.stats['finite']) == 1.0 and int(kept.stats['non_finite']) == 0
  assert float(metrics['loss'][1]) == 4.0   # the batch's examples counted


def test_a_non_finite_new_state_drops_the_client():
  """Any NaN/Inf in the upload, the delta or the new state: upload zeroed,
  weight 0, the old state kept, the metrics dropped."""
  kept, metrics = _drop([tf.constant([1.0, -1.0])], [tf.constant(np.nan)],
                        old_state=[tf.constant(4.0)], weight=7.0)
  np.testing.assert_array_equal(kept.upload[0], [0.0, 0.0])
  assert float(kept.new_state[0]) == 4.0 and float(kept.weight) == 0.0
  assert float(kept.stats['finite']) == 0.0 and int(kept.stats['non_finite']) == 1
  assert float(metrics['loss'][1]) == 0.0
  kept, _ = _drop([tf.constant([np.inf, 0.0])], ())
  np.testing.assert_array_equal(kept.upload[0], [0.0, 0.0])
  assert float(kept.weight) == 0.0
  # A diverged local model with a finite upload (e.g. LocalUpdate's gradient sum).
  kept, _ = _drop([tf.constant([1.0, 1.0])], (), delta=(np.nan, 0.0), weight=7.0)
  np.testing.assert_array_equal(kept.upload[0], [0.0, 0.0])
  assert float(kept.weight) == 0.0


def _client_sum(python: str):
  """A client function summing its dataset into its model's weight (shifted by
  one if positive): in plain TensorFlow (`python=''`), or with a Python `if`
  on a tensor ('if') or a Python loop over the dataset ('for'), which need
  AutoGraph."""
  def client_fn(model, dataset):
    if python == 'for':
      total = tf.constant(0.0)
      for x in dataset:  # needs AutoGraph
        total += x
    else:
      total = local_training.fold(dataset, tf.constant(0.0), lambda acc, x: acc + x)
    if python == 'if':
      if total > 0:  # needs AutoGraph
        total += 1.0
    else:
      total = tf.cond(total > 0, lambda: total + 1.0, lambda: total)
    model.trainable_variables[0].assign([total, 0.0])
    return model.trainable_variables[0].read_value()
  return client_fn


def test_a_client_function_is_traced_without_autograph_unless_it_needs_it():
  """The library's client functions run without AutoGraph (it cost ~1 s of
  each build); one that needs it (a Python `if` on a tensor, a Python loop over
  its dataset) is traced again with it and gives the same result."""
  problem = Problem(num_clients=1, n=4, dim=2)
  results = {}
  for python in ('', 'if', 'for'):
    client_fn = _client_sum(python)
    before = len(rounds.autograph_fallbacks)  # traced where it is defined

    @tff.tensorflow.computation(tff.SequenceType(np.float32))
    def client(dataset):
      return rounds.run_client(problem.model_fn, client_fn,
          dataset)  # pylint: disable=cell-var-from-loop
    results[python] = [client([1.0, 2.0, 0.5]), client([-1.0])]
    results[python, 'fallbacks'] = len(rounds.autograph_fallbacks) - before
  np.testing.assert_allclose(results[''], [[4.5, 0.0], [-1.0, 0.0]])
  for python in ('if', 'for'):
    np.testing.assert_allclose(results[python], results[''])
    assert results[python, 'fallbacks'] == 1, python
  assert results['', 'fallbacks'] == 0
