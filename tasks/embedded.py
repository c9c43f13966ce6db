"""`digits`: a real dataset that ships inside scikit-learn, so runs work offline.

scikit-learn's handwritten digits (1,797 8x8 images from 43 writers, UCI) are
split 80/20 into train/test with a fixed seed; the training part is spread over
`num_clients` clients (default 30) by Dirichlet(alpha) label skew (default
alpha = 0.5, seedable). Model: a 64-128-10 MLP (default) or softmax regression.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tasks import base
from tasks import catalog
from tasks import partition
from tasks.options import TaskOptions

DEFAULT_CLIENTS = catalog.DEFAULT_CLIENTS['digits']


def load_digits_arrays(seed: int = 0):
  """(x_train, y_train, x_test, y_test) as float32 in [0, 1] / int32 labels."""
  from sklearn import datasets  # local import: only this task needs it
  digits = datasets.load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(10_000 + seed).permutation(len(y))
  n_test = len(y) // 5
  test, train = order[:n_test], order[n_test:]
  return x[train], y[train], x[test], y[test]


def _keras_model(name: str) -> tf.keras.Model:
  layers = [tf.keras.layers.InputLayer(input_shape=(64,))]
  if name == 'mlp':
    layers.append(tf.keras.layers.Dense(128, activation='relu'))
  layers.append(tf.keras.layers.Dense(10))
  return tf.keras.Sequential(layers)


def build(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = load_digits_arrays(options.seed)
  num_clients = options.num_clients or DEFAULT_CLIENTS
  parts = partition.dirichlet_label_split(
      y_tr, num_clients, options.dirichlet_alpha, seed=options.seed)
  train = partition.to_client_data(collections.OrderedDict(x=x_tr, y=y_tr), parts)
  batch = options.batch_size

  def preprocess(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.batch(batch)  # elements are already {'x', 'y'}: no map to trace

  element_spec = collections.OrderedDict(x=tf.TensorSpec([None, 64], tf.float32),
                                         y=tf.TensorSpec([None], tf.int32))
  test = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x_te, y=y_te)).batch(500)
  model = options.model or 'mlp'
  return base.Task(
      name='digits', train_data=train, preprocess_fn=preprocess, test_data=test,
      model_fn=base.logits_classifier_fn(lambda: _keras_model(model), element_spec),
      info=dict(model=model, num_train_clients=num_clients, source='sklearn',
                num_train_examples=len(y_tr), num_test_examples=len(y_te),
                dirichlet_alpha=options.dirichlet_alpha))
