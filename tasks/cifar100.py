"""CIFAR-100 image classification on TFF's federated CIFAR-100 (500 clients).

* 'resnet18': TFF's baseline: ResNet-18 with GroupNorm on 24x24 crops (TFF's
  default crop), per-image standardisation.
* 'cnn004': paper 004's CNN (`tasks.models.cifar_cnn_004`) on 28x28 crops
  with TFF's same preprocessing otherwise (the paper's text: a random flip and
  a random 28x28 crop).
* 'cnn004_code': the same CNN on whole 32x32 images, preprocessed as the FedGBO
  authors' code does: pixels / 255 normalised by fixed per-channel means and
  deviations (the code's, CIFAR-10's values), each training batch flipped with
  probability 1/2 and cropped back to 32x32 from its 4-pixel zero-padded images
  at one offset (torchvision on a batch tensor), evaluation on the whole images.

Training images are distorted as TFF's baseline with `distort_train_images`,
Reddi et al. and papers 002/004 do: a random crop of the model's size and a
random horizontal flip, drawn by stateless ops from the trainer's per-(seed,
round, client) seed (`tasks.image_augment`), so runs stay reproducible.
Evaluation (and a client dataset asked for without that seed) uses the central
crop.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines.cifar100 import image_classification_preprocessing
from tensorflow_federated.python.simulation.baselines.cifar100 import image_classification_tasks

from tasks import base
from tasks import image_augment
from tasks import models
from tasks import registry
from tasks import tff_data

NAME = 'cifar100_image'
DEFAULT_MODEL = 'resnet18'
NUM_CLASSES = 100
CROP = {
    'resnet18': (tff.simulation.baselines.cifar100.DEFAULT_CROP_HEIGHT,
                 tff.simulation.baselines.cifar100.DEFAULT_CROP_WIDTH),  # 24
    'resnet18_gn2': (tff.simulation.baselines.cifar100.DEFAULT_CROP_HEIGHT,
                     tff.simulation.baselines.cifar100.DEFAULT_CROP_WIDTH),
    'cnn004': (28, 28),
    'cnn004_code': (32, 32),
}
# The FedGBO code's normalisation of CIFAR-100 (data_utils.load_cifar100: "means and
# stds computed per channel for entire dataset"; they are CIFAR-10's usual values).
CODE_MEANS = (0.4914, 0.4822, 0.4465)
CODE_STDS = (0.2023, 0.1994, 0.2010)
CODE_PAD = 4  # RandomCrop(32, padding=4)
EVAL_BATCH_SIZE = 64  # TFF's default evaluation batch size for this task


def build(options: registry.TaskOptions) -> base.Task:
  model = options.model or DEFAULT_MODEL
  raw, train = tff_data.load_clients('cifar100', options)
  train_spec = tff_data.train_client_spec(options.batch_size)
  height, width = CROP[model]

  if model == 'cnn004_code':
    normalise = image_augment.channel_normaliser(CODE_MEANS, CODE_STDS)
    train_fn = image_augment.normalised_batches(normalise, options.batch_size)
    eval_fn = image_augment.normalised_batches(normalise, EVAL_BATCH_SIZE)
    spec = train_fn(train.create_tf_dataset_for_client(train.client_ids[0])).element_spec
    model_fn = base.logits_classifier_fn(
        lambda: models.cifar_cnn_004(NUM_CLASSES, size=height), spec)
    return tff_data.baseline_task(
        NAME, raw, train, model, train_fn, model_fn, eval_fn,
        augment_fn=image_augment.batch_augmenting_preprocess(
            (height, width, 3), options.batch_size, CODE_PAD, normalise),
        num_classes=NUM_CLASSES, crop=(height, width),
        train_augmentation='per batch: flip, pad 4, random 32x32 crop (the authors\' code)',
        normalisation='per channel, fixed means and deviations (the authors\' code)',
        eval_batch_size=EVAL_BATCH_SIZE)

  if model in ('resnet18', 'resnet18_gn2'):
    create_task = (
        image_classification_tasks.create_image_classification_task_with_datasets)
    baseline = create_task(
        train_client_spec=train_spec, eval_client_spec=None,
        model_id='resnet18', crop_height=height, crop_width=width,
        distort_train_images=False, train_data=train, test_data=raw.test)
    datasets, model_fn = baseline.datasets, baseline.model_fn
    if model == 'resnet18_gn2':  # Reddi et al.'s GroupNorm groups (`models.REDDI_GN_GROUPS`)
      model_fn = base.keras_model_fn(
          lambda: models.cifar_resnet18((height, width, 3), NUM_CLASSES,
                                        groups=models.REDDI_GN_GROUPS),
          datasets.element_type_structure, tf.keras.losses.SparseCategoricalCrossentropy,
          lambda: [tf.keras.metrics.SparseCategoricalAccuracy()])
  else:
    # Building TFF's task here would construct a throwaway ResNet-18, so the
    # same TFF preprocessing is assembled directly.
    crop_shape = (height, width, 3)
    eval_spec = tff.simulation.baselines.ClientSpec(
        num_epochs=1, batch_size=EVAL_BATCH_SIZE, shuffle_buffer_size=1)
    datasets = tff.simulation.baselines.BaselineTaskDatasets(
        train_data=train, test_data=raw.test, validation_data=None,
        train_preprocess_fn=image_classification_preprocessing
        .create_preprocess_fn(train_spec, crop_shape=crop_shape),
        eval_preprocess_fn=image_classification_preprocessing
        .create_preprocess_fn(eval_spec, crop_shape=crop_shape))
    model_fn = base.logits_classifier_fn(
        lambda: models.cifar_cnn_004(NUM_CLASSES), datasets.element_type_structure)

  return tff_data.baseline_task(
      NAME, raw, train, model, datasets.train_preprocess_fn, model_fn,
      datasets.eval_preprocess_fn,
      augment_fn=image_augment.augmenting_preprocess((height, width, 3), options.batch_size),
      num_classes=NUM_CLASSES, crop=(height, width), train_augmentation='random crop, flip',
      eval_batch_size=EVAL_BATCH_SIZE)
