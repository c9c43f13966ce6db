"""EMNIST autoencoder on TFF's federated EMNIST-62 (Reddi et al. 2021, "EMNIST AE").

Data and preprocessing are TFF's autoencoder baseline
(`tff.simulation.baselines.emnist.create_autoencoder_task_from_datasets`):
each 28x28 image becomes x = 1 - pixels (784 values) and the target is x
itself. The model is TFF's bottleneck autoencoder (dense 1000-500-250-30-250-
500-1000-784, sigmoid except the linear 30-unit code). The loss is the mean
squared error SUMMED over the batch, as in Reddi et al.'s code
(google-research/federated, optimization/emnist_ae), whose tuned client
learning rates (10^0.5 to 10^1.5) assume that reduction; TFF's baseline
averages over the batch instead. The reported metric is Keras's
`mean_squared_error` (the per-example mean): Reddi et al.'s Table 2 gives it
x 1000, lower is better.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.emnist import autoencoder_tasks
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing

from tasks import base
from tasks import registry
from tasks import tff_data

NAME = 'emnist_autoencoder'
EVAL_BATCH_SIZE = 64  # TFF's default for this baseline


def autoencoder_model_fn(element_spec):
  return base.keras_model_fn(
      emnist_models.create_autoencoder_model, element_spec,
      lambda: tf.keras.losses.MeanSquaredError(reduction=tf.keras.losses.Reduction.SUM),
      lambda: [tf.keras.metrics.MeanSquaredError(), tf.keras.metrics.MeanAbsoluteError()])


def build(options: registry.TaskOptions) -> base.Task:
  raw, train = tff_data.load_clients('emnist', options)
  train_spec = tff_data.train_client_spec(options.batch_size)
  baseline = autoencoder_tasks.create_autoencoder_task_from_datasets(
      train_client_spec=train_spec, eval_client_spec=None, train_data=train,
      test_data=raw.test)
  datasets = baseline.datasets
  # TFF's train preprocessing with batch order kept (its map is non-deterministic
  # unless given a debug seed, which with no shuffle buffer does nothing else).
  preprocess_fn = emnist_preprocessing.create_preprocess_fn(
      train_spec, emnist_task='autoencoder', debug_seed=0)
  return tff_data.baseline_task(
      NAME, raw, train, 'tff_ae', preprocess_fn,
      autoencoder_model_fn(datasets.element_type_structure), datasets.eval_preprocess_fn,
      loss='mse summed over the batch', eval_batch_size=EVAL_BATCH_SIZE)
