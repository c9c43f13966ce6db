"""What the benchmarks time: synthetic tasks of a model's shape, the round's
SGD steps in plain TensorFlow (`PlainTF`, the compute floor), a learning
process's rounds (`Rounds`), and every registry algorithm built for them
(`algorithm_rounds`)."""

from __future__ import annotations

import collections
import time

import numpy as np

CLIENTS, STEPS, BATCH = 10, 10, 20
# (g): name -> (example shape, classes, model builder, Keras output is logits).
MODELS = {
    'emnist_cnn': ((28, 28, 1), 62, 'femnist_cnn', True),  # papers 000/004, (a)'s model
    'cifar100_resnet18': ((24, 24, 3), 100, 'cifar_resnet18', False),  # TFF's baseline
}


def synthetic_task(model: str, n_clients: int, seed: int):
  """`n_clients` clients of STEPS batches of BATCH random examples of `model`'s
  task shape (features and labels uniform), with that model."""
  import tensorflow as tf
  from tasks import base, models, partition
  shape, classes, builder, logits = MODELS[model]
  rng = np.random.default_rng(seed)
  n = n_clients * STEPS * BATCH
  x = rng.random((n, *shape), dtype=np.float32)
  y = rng.integers(0, classes, n).astype(np.int32)
  spec = collections.OrderedDict(x=tf.TensorSpec([None, *shape], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  keras_fn = lambda: getattr(models, builder)(num_classes=classes)  # noqa: E731
  return base.Task(
      name=f'{model}_shaped', train_data=partition.to_client_data(
          collections.OrderedDict(x=x, y=y), np.array_split(np.arange(n), n_clients)),
      preprocess_fn=lambda ds: ds.batch(BATCH),
      model_fn=base.keras_model_fn(
          keras_fn, spec,
          lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=logits),
          lambda: [tf.keras.metrics.SparseCategoricalAccuracy()]))


class PlainTF:
  """The round's SGD steps without TFF: CLIENTS * STEPS steps in one
  `tf.function` loop over one client's data repeated (the compute floor), or
  one `tf.function` call per client from the same initial weights."""

  def __init__(self, task, optimizer_spec, trace_client=None):
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_algos.core import local_training
    model = task.model_fn()
    weights = tff.learning.models.ModelWeights.from_model(model)
    init = tf.nest.map_structure(lambda v: v.read_value(), weights)
    dataset = task.train_data.create_tf_dataset_for_client(
        task.client_ids[0]).repeat(CLIENTS).batch(BATCH)
    opt = optimizer_spec.build()

    @tf.function
    def floor_loop():
      return local_training.run_local_training(
          model, opt, None, init, dataset, CLIENTS * STEPS, 1).num_steps

    @tf.function
    def client_loop(client_dataset):  # one client's STEPS steps, as in a round
      return local_training.run_local_training(
          model, opt, None, init, client_dataset, STEPS, -1).num_steps

    self._floor, self._client = floor_loop, client_loop
    # Traced now, before TFF builds Keras models in graphs of its own.
    floor_loop()
    if trace_client is not None:
      client_loop(trace_client)

  def floor_once(self) -> float:
    t0 = time.perf_counter()
    assert int(self._floor()) == CLIENTS * STEPS
    return time.perf_counter() - t0

  def per_client_once(self, datasets) -> float:
    t0 = time.perf_counter()
    assert sum(int(self._client(d)) for d in datasets) == CLIENTS * STEPS
    return time.perf_counter() - t0


class Rounds:
  """A process and its state (and client states), advanced one timed round at a time."""

  def __init__(self, process, data, client_states=None):
    self.process, self.data, self.client_states = process, data, client_states
    self.state = None

  def start(self, state):
    self.state = state
    return self

  def time(self, rounds: int = 1) -> float:
    """Seconds of the last of `rounds` rounds."""
    if self.state is None:
      self.state = self.process.initialize()
    for _ in range(rounds):
      t0 = time.perf_counter()
      if self.client_states is None:
        self.state = self.process.next(self.state, self.data).state
      else:
        out = self.process.next(self.state, self.data, self.client_states)
        self.state, self.client_states = out.state, out.client_states
      seconds = time.perf_counter() - t0
    return seconds

  def median(self, rounds: int, warmup: int = 2) -> float:
    self.time(warmup)
    return float(np.median([self.time() for _ in range(rounds)]))


def algorithm_rounds(name: str, task, data: list, candidates) -> tuple['Rounds', object]:
  """The registry's `name` built with the first of `candidates` (HParams) it
  accepts, as `Rounds` on `data` (with fresh client states if it keeps them),
  and that candidate."""
  from tff_algos.core import stateful_process
  from tff_algos.flags import algorithm_flags
  error = None
  for hp in candidates:
    try:
      alg = algorithm_flags.build(name, task.model_fn, hp)
      break
    except ValueError as e:
      error = e
  else:
    raise error
  if not getattr(alg, 'stateful_clients', False):
    return Rounds(alg.process, data), hp
  state = alg.process.initialize(stateful_process.population_of(
      task, alg.process.needs_mean_examples))
  return Rounds(alg.process, data,
                 [alg.process.initial_client_state(state)] * len(data)).start(state), hp
