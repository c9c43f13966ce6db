"""CIFAR-10 as Reddi et al. 2021 ran it: 500 clients of 100 images, label skew by LDA.

TFF 0.87 has no federated CIFAR-10, so the 50,000 training images of
tensorflow-datasets' prepared 'cifar10' (read from `--cache_dir`, never
downloaded) are split here with the latent Dirichlet allocation of Hsu et al.
2019 that Reddi et al. use: every client draws class proportions
q ~ Dir(alpha 1_10) and fills its 100 examples by drawing labels from q,
without replacement (`partition.dirichlet_prior_split`); alpha is
`--dirichlet_alpha` (the configs use 0.1) and the split is a function of
`--seed`. The 10,000 test images are the evaluation set.

Model and preprocessing are TFF's CIFAR-100 baseline with 10 classes: ResNet-18
with GroupNorm on 24x24 images (TFF's `resnet_models.create_resnet18`,
softmax output; `resnet18_gn2`: with Reddi et al.'s 2 groups a GroupNorm layer), training images randomly cropped and flipped
(`tasks.image_augment`), evaluation on the central crop, each image
standardised.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tasks import base
from tasks import catalog
from tasks import feddyn_data
from tasks import image_augment
from tasks import models
from tasks import partition
from tasks import registry

NAME = 'cifar10_image'
NUM_CLASSES = 10
NUM_CLIENTS = catalog.DEFAULT_CLIENTS['cifar10_image']
EXAMPLES_PER_CLIENT = 100
CROP_SHAPE = (24, 24, 3)
EVAL_BATCH_SIZE = 64
# model -> its GroupNorm groups (None: TFF's 32; `models.REDDI_GN_GROUPS`: Reddi et al.'s code)
MODELS = {'resnet18': None, 'resnet18_gn2': models.REDDI_GN_GROUPS}


def lda_split(labels: np.ndarray, num_clients: int, alpha: float, seed: int
              ) -> list[np.ndarray]:
  """`num_clients` clients of len(labels) // num_clients examples (at most 100,
  Reddi et al.'s size), label proportions Dir(alpha) per client."""
  size = min(EXAMPLES_PER_CLIENT, len(labels) // num_clients)
  if size < 1:
    raise base.TaskError(f'{num_clients} clients for only {len(labels)} examples; lower --num_clients')
  try:
    return partition.dirichlet_prior_split(labels, np.full(num_clients, size), alpha, seed)
  except ValueError as e:
    raise base.TaskError(str(e)) from None


def _eval_map(example):
  image = image_augment.central_crop(tf.cast(example['image'], tf.float32), CROP_SHAPE)
  return tf.image.per_image_standardization(image), example['label']


def build(options: registry.TaskOptions) -> base.Task:
  model = options.model or 'resnet18'
  x_tr, y_tr, x_te, y_te = feddyn_data.load_tfds_arrays('cifar10', options.cache_dir)
  num_clients = options.num_clients or NUM_CLIENTS
  parts = lda_split(y_tr, num_clients, options.dirichlet_alpha, options.seed)
  element_spec = (tf.TensorSpec([None, *CROP_SHAPE], tf.float32),
                  tf.TensorSpec([None], tf.int32))
  return partition.array_task(
      NAME, ('image', 'label'), (x_tr, y_tr), (x_te, y_te), parts, options.batch_size,
      EVAL_BATCH_SIZE, lambda ds, batch: ds.map(_eval_map).batch(batch),
      augment_fn=image_augment.augmenting_preprocess(CROP_SHAPE, options.batch_size),
      model_fn=base.keras_model_fn(
          lambda: models.cifar_resnet18(CROP_SHAPE, NUM_CLASSES, groups=MODELS[model]),
          element_spec,
          tf.keras.losses.SparseCategoricalCrossentropy,
          lambda: [tf.keras.metrics.SparseCategoricalAccuracy()]),
      info=dict(model=model, source='tfds cifar10', num_train_clients=num_clients,
                examples_per_client=len(parts[0]), partition='lda',
                dirichlet_alpha=options.dirichlet_alpha, num_test_examples=len(y_te),
                train_augmentation='random crop, flip', eval_batch_size=EVAL_BATCH_SIZE))
