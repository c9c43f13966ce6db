"""Cost accounting: bytes from TFF types, FLOPs against hand counts, and the
per-round / cumulative cost columns of metrics.csv across a resume."""

import collections
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from processes import run_crashed_then_resumed
from tasks import TaskOptions
from tasks import embedded
from tff_algos.algorithms import fedopt
from tff_algos.core import accounting
from tff_algos.core import optimizers
from tff_algos import training
from tff_algos.training import sampling

D, H, C = 64, 128, 10   # a Dense D -> H (relu) -> C model


def dense_model_fn(hidden=True):
  spec = collections.OrderedDict(x=tf.TensorSpec([None, D], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))

  def model_fn():
    layers = [tf.keras.Input((D,))]
    if hidden:
      layers.append(tf.keras.layers.Dense(H, activation='relu'))
    layers.append(tf.keras.layers.Dense(C))
    return tff.learning.models.from_keras_model(
        tf.keras.Sequential(layers), input_spec=spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model_fn


def test_training_step_flops_match_a_hand_count():
  model_fn = dense_model_fn()
  # Marginal cost of one more example (per-step constants cancel).
  per_example = (accounting.training_step_flops(model_fn, 3)
                 - accounting.training_step_flops(model_fn, 2))
  # Matrix products, 2 FLOPs per multiply-add: forward x W1 and h W2
  # (2DH + 2HC), weight gradients x^T dz1 and h^T dz2 (2DH + 2HC), and the
  # gradient into the hidden layer dz2 W2^T (2HC); none into the input.
  matmul = 2 * D * H + 2 * H * C + 2 * D * H + 2 * H * C + 2 * H * C
  assert matmul == 40448
  # Bias adds and bias gradients (H + C each); what is left are the loss's
  # elementwise ops (softmax cross-entropy and its gradient: ~C, measured 15).
  rest = per_example - matmul - 2 * (H + C)
  assert 0 < rest <= 2 * C
  # model_cost divides a 4-example step by 4: within the per-step constants.
  cost = accounting.model_cost(model_fn)
  assert cost.num_params == D * H + H + H * C + C
  assert cost.fwd_bwd_flops_per_example == pytest.approx(per_example, rel=1e-3)
  # Without the hidden layer: 2DC forward + 2DC weight gradient.
  linear = dense_model_fn(hidden=False)
  rest = (accounting.training_step_flops(linear, 3) - accounting.training_step_flops(linear, 2)
          - 4 * D * C - 2 * C)
  assert 0 < rest <= 2 * C


def test_rnn_layers_are_unrolled_for_the_count():
  # An RNN's step runs once per time step: T steps cost T times one step.
  def model_fn(steps):
    spec = collections.OrderedDict(x=tf.TensorSpec([None, steps, 3], tf.float32),
                                   y=tf.TensorSpec([None], tf.int32))
    return lambda: tff.learning.models.from_keras_model(
        tf.keras.Sequential([tf.keras.Input((steps, 3)), tf.keras.layers.SimpleRNN(4),
                             tf.keras.layers.Dense(2)]),
        input_spec=spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  f2, f4, f6 = (accounting.training_step_flops(model_fn(t), 1) for t in (2, 4, 6))
  assert f4 - f2 == f6 - f4 > 2 * (3 * 4 + 4 * 4)   # at least the step's matmuls


def test_round_client_flops_formula():
  cost = accounting.ModelCost(fwd_bwd_flops_per_example=100.0, num_params=10)
  row = {'round': 1, 'client_work/train/num_examples': 64.0,
         'client_work/client_steps': 4.0}
  sgd = accounting.ComputeModel()
  assert accounting.round_client_flops(sgd, cost, row) == 100 * 64 + 2 * 10 * 4
  sgdm = accounting.ComputeModel(optimizer_flops_per_param=4)
  assert accounting.round_client_flops(sgdm, cost, row) == 100 * 64 + 4 * 10 * 4
  # Extra gradient passes: the whole local dataset, or its first minibatch.
  data = [tf.data.Dataset.from_tensor_slices(np.zeros((n, 2), np.float32)).batch(8)
          for n in (20, 5)]
  assert accounting.dataset_size(data[0]) == (20, 3, 8)
  sizes = accounting.ClientSizes()
  cohort = (sizes, ['a', 'b'], data)
  full = accounting.ComputeModel(extra_gradient='full_batch')
  one = accounting.ComputeModel(extra_gradient='one_batch')
  assert accounting.round_client_flops(full, cost, row, *cohort) == 100 * (64 + 25) + 80
  assert accounting.round_client_flops(one, cost, row, *cohort) == 100 * (64 + 8 + 5) + 80
  assert np.isnan(accounting.round_client_flops(sgd, cost, {'round': 1}))
  # A model without a num_examples metric: steps x the first client's mean
  # batch size (20 examples in 3 batches), kept for the run.
  no_count = {'round': 1, 'client_steps': 6.0}
  assert accounting.round_client_flops(sgd, cost, no_count, *cohort) == pytest.approx(
      100 * 6 * 20 / 3 + 120)
  assert sizes.mean_batch_size(['b'], data[1:]) == 20 / 3
  # Sizes are counted once per client: a client's later (other) dataset is
  # not read again.
  assert sizes(['a'], [None]) == [(20, 3, 8)]


def test_type_bytes_count_tensors_and_skip_sequences():
  t = tff.StructType([tff.TensorType(np.float32, [3, 4]), tff.TensorType(np.int64, [2]),
                      tff.SequenceType(tff.TensorType(np.float32, [None, 5]))])
  assert accounting.type_bytes(t) == 3 * 4 * 4 + 2 * 8
  with pytest.raises(ValueError, match='unknown shape'):
    accounting.type_bytes(tff.TensorType(np.float32, [None]))


@pytest.fixture(scope='module')
def task():
  return embedded.build(TaskOptions(batch_size=16, num_clients=12, model='mlp'))


def test_cost_columns_accumulate_and_continue_across_a_resume(task, tmp_path):
  algorithm = fedopt.build_fedopt(task.model_fn,
      fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=3))
  # Bytes: the MLP's float32 weights down (plus the round's hyperparameters)
  # and the weights-sized update up (plus weight and metrics).
  n = 64 * 128 + 128 + 128 * 10 + 10
  assert algorithm.traffic.model_bytes == 4 * n
  assert 4 * n < algorithm.traffic.download_bytes < 4 * n + 64
  assert 4 * n < algorithm.traffic.upload_bytes < 4 * n + 256

  def config(out, rounds):
    return training.RunConfig(total_rounds=rounds, clients_per_round=4, rounds_per_eval=2,
                              rounds_per_checkpoint=2, output_dir=out, progress=False)

  full = training.run_training(algorithm, task, config(str(tmp_path / 'full'), 5))
  cost = accounting.model_cost(task.model_fn)
  for i, row in enumerate(full.history):
    examples = row['client_work/train/num_examples']
    # K = 3 batches per sampled client (its dataset repeated as needed).
    cohort = sampling.sample_clients(task.client_ids, 4, 0, i)
    expected = sum(sum(int(tf.shape(tf.nest.flatten(b)[0])[0]) for b in
                       task.client_dataset(c).repeat().take(3)) for c in cohort)
    assert examples == expected
    assert row['client_flops'] == pytest.approx(
        cost.fwd_bwd_flops_per_example * examples + 2 * n * row['client_work/client_steps'])
  rows = full.history
  for key, cum in accounting.CUMULATIVE_COLUMNS:
    np.testing.assert_allclose([r[cum] for r in rows], np.cumsum([r[key] for r in rows]))
  assert rows[-1]['cum_upload_bytes'] == 5 * 4 * algorithm.traffic.upload_bytes

  out = str(tmp_path / 'crashed')
  resumed = run_crashed_then_resumed(algorithm, task, config(out, 5), crash_after=4)
  assert resumed.resumed_from == 2
  assert resumed.history[0]['round'] == 3
  on_disk = training.read_metrics(os.path.join(out, 'metrics.csv'))
  assert [r['round'] for r in on_disk] == [1, 2, 3, 4, 5]
  for a, b in zip(rows, on_disk):
    for _, cum in accounting.CUMULATIVE_COLUMNS:
      assert b[cum] == pytest.approx(a[cum])
  summary = json.load(open(os.path.join(out, 'summary.json')))
  assert summary['totals']['client_flops'] == pytest.approx(rows[-1]['cum_client_flops'])
  assert summary['totals']['upload_bytes'] == rows[-1]['cum_upload_bytes']
  assert summary['fwd_bwd_flops_per_example'] == cost.fwd_bwd_flops_per_example
  assert summary['num_params'] == n
