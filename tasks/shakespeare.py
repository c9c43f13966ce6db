"""Shakespeare next-character prediction (one client per role), TFF's pipeline.

Sequences of 80 characters (TFF's default) over TFF's 90-token vocabulary (86
characters + pad/oov/bos/eos). Models: 'lstm' is TFF's 2 x LSTM-256, 'gru' the
2 x GRU-256 of paper 000, 'gru128' the 2 x GRU-128 of paper 004. All use TFF's
loss (sparse CE on logits) and metrics (token count and accuracy, pad masked).
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_preprocessing
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_tasks

from tasks import base
from tasks import models
from tasks import registry
from tasks import tff_data

NAME = 'shakespeare_character'
DEFAULT_MODEL = 'lstm'
SEQUENCE_LENGTH = tff.simulation.baselines.shakespeare.DEFAULT_SEQUENCE_LENGTH
VOCAB_SIZE = tff.simulation.baselines.shakespeare.VOCAB_LENGTH
_GRU_UNITS = {'gru': 256, 'gru128': 128}


def _metrics() -> list[tf.keras.metrics.Metric]:
  pad, _, _, _ = char_prediction_preprocessing.get_special_tokens()
  metrics = tff.simulation.baselines.keras_metrics
  return [metrics.NumTokensCounter(masked_tokens=[pad]),
          metrics.MaskedCategoricalAccuracy(masked_tokens=[pad])]


def build(options: registry.TaskOptions) -> base.Task:
  model = options.model or DEFAULT_MODEL
  raw, train = tff_data.load_clients('shakespeare', options)
  create_task = (
      char_prediction_tasks.create_character_prediction_task_from_datasets)
  baseline = create_task(
      train_client_spec=tff_data.train_client_spec(options.batch_size),
      eval_client_spec=None, sequence_length=SEQUENCE_LENGTH,
      train_data=train, test_data=raw.test)
  datasets = baseline.datasets

  if model == 'lstm':
    model_fn = baseline.model_fn
  else:
    units = _GRU_UNITS[model]
    model_fn = base.logits_classifier_fn(
        lambda: models.shakespeare_gru(VOCAB_SIZE, units=units),
        datasets.element_type_structure, metrics_fn=_metrics)

  return tff_data.baseline_task(NAME, raw, train, model, datasets.train_preprocess_fn,
                                model_fn, datasets.eval_preprocess_fn,
                                vocab_size=VOCAB_SIZE, sequence_length=SEQUENCE_LENGTH,
                                eval_batch_size=32)
