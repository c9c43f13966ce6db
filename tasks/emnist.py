"""FEMNIST: TFF's federated EMNIST-62 (a client per writer), TFF/paper CNNs.

Data, preprocessing, loss and metrics are TFF's character-recognition baseline
(`tff.simulation.baselines.emnist`); 'femnist_cnn' is the CNN of papers 000/004
(`tasks.models.femnist_cnn`, logits + `from_logits=True` loss).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.emnist import char_recognition_tasks
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing

from tasks import base
from tasks import models
from tasks import registry
from tasks import tff_data

NAME = 'emnist_character'
DEFAULT_MODEL = 'femnist_cnn'
NUM_CLASSES = 62


def build(options: registry.TaskOptions) -> base.Task:
  model = options.model or DEFAULT_MODEL
  raw, train = tff_data.load_clients('emnist', options)
  train_spec = tff_data.train_client_spec(options.batch_size)
  baseline = (
      char_recognition_tasks.create_character_recognition_task_from_datasets(
          train_client_spec=train_spec, eval_client_spec=None,
          model_id=model if model in models.EMNIST_TFF_MODELS else 'cnn',
          only_digits=False, train_data=train, test_data=raw.test))
  datasets = baseline.datasets
  # TFF's EMNIST preprocessing maps batches with `deterministic=False` unless a
  # debug seed is given; with shuffle_buffer_size=1 the seed does nothing else,
  # so this is TFF's train preprocessing with batch order preserved.
  preprocess_fn = emnist_preprocessing.create_preprocess_fn(
      train_spec, emnist_task='character_recognition', debug_seed=0)

  if model in models.EMNIST_TFF_MODELS:
    model_fn = baseline.model_fn
  else:
    model_fn = base.logits_classifier_fn(
        lambda: models.femnist_cnn(NUM_CLASSES), datasets.element_type_structure)

  return tff_data.baseline_task(NAME, raw, train, model, preprocess_fn, model_fn,
                                datasets.eval_preprocess_fn, num_classes=NUM_CLASSES,
                                eval_batch_size=64)
