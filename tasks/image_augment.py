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


def flip_then_padded_crop(images: tf.Tensor, pad: int, key: tf.Tensor) -> tf.Tensor:
  """[B, H, W, C] images augmented each independently, as paper 003's authors'
  code does (alpemreacar/FedDyn, utils_dataset.py, `Dataset.__getitem__` with
  train=True, on already normalised images): flipped left-right with probability
  1/2; then, with probability 1/2, replaced by the H x W window at a uniform
  offset in {0..2 pad}^2 of the image zero-padded by `pad` on each side (zero in
  normalised space). Offset (pad, pad) is the image itself, which is what an
  image not cropped gets. Drawn by stateless ops from a [2] int64 `key`, a draw
  per image."""
  n = tf.shape(images)[0]
  height, width = images.shape[1], images.shape[2]
  flip_key, crop_key, offset_key = tf.unstack(
      tf.random.experimental.stateless_split(key, 3))
  flip = tf.random.stateless_uniform([n], flip_key) < 0.5
  images = tf.where(flip[:, None, None, None], tf.reverse(images, [2]), images)
  crop = tf.random.stateless_uniform([n], crop_key) < 0.5
  offsets = tf.random.stateless_uniform([n, 2], offset_key, 0, 2 * pad + 1, tf.int32)
  offsets = tf.where(crop[:, None], offsets, tf.constant(pad, tf.int32))
  padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
  rows = offsets[:, :1] + tf.range(height)   # [B, H] rows of the padded images
  cols = offsets[:, 1:] + tf.range(width)    # [B, W]
  images = tf.gather(padded, rows, axis=1, batch_dims=1)
  return tf.gather(images, cols, axis=2, batch_dims=1)


def per_image_augmenting_batches(batches: Callable[[tf.data.Dataset], tf.data.Dataset],
                                 pad: int, image_key: str = 'x') -> SeededPreprocessFn:
  """(raw client dataset, seed) -> `batches(dataset)` (dicts of normalised images
  under `image_key`), each image then augmented by `flip_then_padded_crop` with
  the key (seed, index of the batch in the epoch): independent draws for every
  image of the epoch, fresh ones for each seed (the trainer's (seed, round,
  client) seed). A round that repeats the epoch repeats its draws by position,
  on images reshuffled into other positions."""
  def preprocess(dataset: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    seed = tf.constant(seed, tf.int64)

    def augment(index, batch):
      batch = type(batch)(batch)   # a copy, of the same mapping type
      batch[image_key] = flip_then_padded_crop(batch[image_key], pad,
                                               tf.stack([seed, index]))
      return batch

    return batches(dataset).enumerate().map(augment)

  return preprocess
