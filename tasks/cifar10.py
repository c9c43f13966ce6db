"""`cifar10_lenet`: LeNet-5 on CIFAR-10 from tensorflow-datasets (paper 001).

The paper trains LeNet (a 5-layer CNN) with cross-entropy and minibatch 1024:
pass `--client_batch_size=1024`. Data come from TFDS's prepared 'cifar10'
(`tfds.load(..., data_dir=cache_dir, download=False)`; nothing is downloaded):
the 50,000 training images are split over `num_clients` clients (default 10,
`--partition`), the 10,000 test images are the evaluation set. Images are
scaled to [0, 1] and standardised with the training-set channel statistics.
"""

from __future__ import annotations

import collections
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tasks import base
from tasks import catalog
from tasks import models
from tasks import partition
from tasks.options import TaskOptions

NAME = 'cifar10_lenet'
DEFAULT_CLIENTS = catalog.DEFAULT_CLIENTS['cifar10_lenet']
CHANNEL_MEAN = (0.4914, 0.4822, 0.4465)
CHANNEL_STD = (0.2470, 0.2435, 0.2616)


def lenet5(num_classes: int = 10) -> tf.keras.Model:
  """LeNet-5 for 32x32x3: conv5(6)-pool-conv5(16)-pool-fc120-fc84-fc(logits)."""
  return models.conv_pool_net((32, 32, 3), num_classes, 'lenet5', filters=(6, 16),
                              kernel=5, hidden=(120, 84))


def tfds_data_dir(cache_dir: Optional[str]) -> str:
  """Where TFDS looks for prepared data: cache_dir, $TFDS_DATA_DIR or ~/tensorflow_datasets."""
  return os.path.expanduser(cache_dir or os.environ.get('TFDS_DATA_DIR')
                            or '~/tensorflow_datasets')


def _missing(data_dir: str, why: str) -> base.TaskError:
  return base.TaskError(
      f'CIFAR-10 is not available from tensorflow-datasets under '
      f'{os.path.join(data_dir, "cifar10")} ({why}). Prepare it once with network '
      f'access: python -c "import tensorflow_datasets as tfds; '
      f"tfds.load('cifar10', data_dir='{data_dir}')\" and pass --cache_dir={data_dir}.")


def load_cifar10(cache_dir: Optional[str]):
  """(x_train uint8, y_train, x_test, y_test) from a prepared TFDS 'cifar10'."""
  data_dir = tfds_data_dir(cache_dir)
  if not os.path.isdir(os.path.join(data_dir, 'cifar10')):
    raise _missing(data_dir, 'no such directory')
  try:
    import tensorflow_datasets as tfds
  except Exception as e:  # broken installs raise ImportError or worse
    raise base.TaskError(f'tensorflow-datasets cannot be imported: {e}') from None
  try:
    splits = tfds.load('cifar10', split=['train', 'test'], data_dir=data_dir,
                       download=False, as_supervised=True)
  except Exception as e:  # TFDS raises AssertionError / DatasetNotFoundError
    raise _missing(data_dir, f'{type(e).__name__}: {e}') from None
  # Batches of 10k rather than `batch_size=-1`, which aborts the process under
  # TFDS's mock_data with TF 2.14 (std::length_error).
  (x_tr, y_tr), (x_te, y_te) = [
      tuple(np.concatenate(parts) for parts in zip(*tfds.as_numpy(ds.batch(10_000))))
      for ds in splits]
  return x_tr, y_tr.astype(np.int32), x_te, y_te.astype(np.int32)


def _standardise(images: tf.Tensor) -> tf.Tensor:
  x = tf.cast(images, tf.float32) / 255.0
  return (x - tf.constant(CHANNEL_MEAN)) / tf.constant(CHANNEL_STD)


def build(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = load_cifar10(options.cache_dir)
  num_clients = options.num_clients or DEFAULT_CLIENTS
  try:
    parts = partition.split(y_tr, num_clients, options.partition, options.seed,
                            options.dirichlet_alpha)
  except ValueError as e:
    raise base.TaskError(str(e)) from None
  return partition.array_task(
      NAME, ('x', 'y'), (x_tr, y_tr), (x_te, y_te), parts, options.batch_size, 1000,
      lambda ds, batch: ds.batch(batch).map(lambda e: collections.OrderedDict(
          x=_standardise(e['x']), y=e['y'])),
      model_fn=base.logits_classifier_fn(lenet5, ELEMENT_SPEC),
      info=dict(model='lenet5', source=f'tfds cifar10 ({tfds_data_dir(options.cache_dir)})',
                num_train_clients=num_clients, partition=options.partition,
                num_train_examples=len(y_tr), num_test_examples=len(y_te)))


ELEMENT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 32, 32, 3], tf.float32), y=tf.TensorSpec([None], tf.int32))
