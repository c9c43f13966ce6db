"""Random crop and horizontal flip of CIFAR images, drawn by stateless ops.

TFF's CIFAR baseline distorts training images with `tf.image.random_crop` and
`random_flip_left_right` (crop to the model's input size, no padding; flip with
probability 1/2), then standardises each image. Those ops are seeded by TF's
global state, so a run could not be repeated or resumed to the same model. Here
the same distortion is drawn with stateless ops keyed by (seed, position of the
example in the client's shuffled epoch), where the trainer derives the seed from
(run seed, round, client): every round sees fresh crops, every rerun the same.
Evaluation uses the central crop (`tf.image.resize_with_crop_or_pad`), as TFF.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

SeededPreprocessFn = Callable[[tf.data.Dataset, int], tf.data.Dataset]


def distort(image: tf.Tensor, crop_shape: Sequence[int], key: tf.Tensor) -> tf.Tensor:
  """Random `crop_shape` crop, then random left-right flip, from a [2] int64 key."""
  crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2))
  image = tf.image.stateless_random_crop(image, crop_shape, seed=crop_key)
  return tf.image.stateless_random_flip_left_right(image, seed=flip_key)


def central_crop(image: tf.Tensor, crop_shape: Sequence[int]) -> tf.Tensor:
  return tf.image.resize_with_crop_or_pad(image, crop_shape[0], crop_shape[1])


def augmenting_preprocess(crop_shape: Sequence[int], batch_size: int,
                          image_key: str = 'image', label_key: str = 'label'
                          ) -> SeededPreprocessFn:
  """(raw client dataset, seed) -> batches of (distorted, standardised image, label),
  the element structure of TFF's CIFAR preprocessing."""
  crop_shape = tuple(crop_shape)

  def preprocess(dataset: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    seed = tf.constant(seed, tf.int64)

    def augment(index, example):
      image = tf.cast(example[image_key], tf.float32)
      image = distort(image, crop_shape, tf.stack([seed, index]))
      return tf.image.per_image_standardization(image), example[label_key]

    return dataset.enumerate().map(augment).batch(batch_size)

  return preprocess


def channel_normaliser(means: Sequence[float], stds: Sequence[float]
                       ) -> Callable[[tf.Tensor], tf.Tensor]:
  """uint8-valued image -> (image / 255 - means) / stds per channel (torchvision's
  `ToTensor` then `Normalize(means, stds)`)."""
  means = tf.constant(means, tf.float32)
  stds = tf.constant(stds, tf.float32)
  return lambda image: (tf.cast(image, tf.float32) / 255.0 - means) / stds


def normalised_batches(normalise: Callable[[tf.Tensor], tf.Tensor], batch_size: int,
                       image_key: str = 'image', label_key: str = 'label'
                       ) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """raw dataset -> batches of (normalised whole image, label): no augmentation."""
  def preprocess(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(lambda e: (normalise(e[image_key]), e[label_key])).batch(batch_size)
  return preprocess


def batch_augmenting_preprocess(crop_shape: Sequence[int], batch_size: int, pad: int,
                                normalise: Callable[[tf.Tensor], tf.Tensor],
                                image_key: str = 'image', label_key: str = 'label'
                                ) -> SeededPreprocessFn:
  """(raw client dataset, seed) -> batches of (image, label) augmented as the FedGBO
  authors' code does: images normalised, batched, then each BATCH flipped left-right
  with probability 1/2 and cropped to `crop_shape` from its `pad`-zero-padded images
  at one random offset (torchvision's `RandomHorizontalFlip` and
  `RandomCrop(size, padding=pad)` applied to a batch tensor draw once for the
  batch). Drawn by stateless ops keyed by (seed, batch index)."""
  crop_shape = list(crop_shape)

  def preprocess(dataset: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    seed = tf.constant(seed, tf.int64)

    def augment(index, batch):
      images, labels = batch
      flip_key, crop_key = tf.unstack(
          tf.random.experimental.stateless_split(tf.stack([seed, index]), 2))
      flip = tf.random.stateless_uniform([], flip_key) < 0.5
      images = tf.cond(flip, lambda: tf.reverse(images, [2]), lambda: images)
      padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
      size = tf.concat([tf.shape(images)[:1], crop_shape], 0)
      images = tf.image.stateless_random_crop(padded, size, seed=crop_key)
      return tf.ensure_shape(images, [None] + crop_shape), labels

    return normalised_batches(normalise, batch_size, image_key, label_key)(
        dataset).enumerate().map(augment)

  return preprocess
