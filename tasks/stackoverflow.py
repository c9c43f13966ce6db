"""StackOverflow tag prediction and next-word prediction (one client per user).

Both are TFF's baselines with TFF's default settings:

* `stackoverflow_tag`: normalised bag of the 10,000 most frequent words ->
  1-vs-rest logistic regression over the 500 most frequent tags; metrics
  precision and `recall_at_5` (top-5 recall, the metric of paper 000). Model
  `logreg`: TFF's binary CE summed over the batch (Reddi et al.'s setting);
  `logreg_mean`: the same model with Keras's default mean over the batch
  (paper 000's TensorFlow code: its learning rates and its training error,
  ~0.02 per example and tag, are in these units); `logreg_code`: `logreg` on
  Reddi et al.'s bag of words (`code_bag_of_words`).
* `stackoverflow_word`: 20-word sequences over a 10,000-word vocabulary (+1 OOV
  bucket, pad, bos, eos), TFF's LSTM (embedding 96, LSTM 670); masked accuracy
  metrics as TFF.

The data comes from `stackoverflow.sqlite`; the vocabularies from TFF's word and
tag count files (see `tasks.tff_data.stackoverflow_vocab`; TFF's own task
constructors would fetch those from the web whatever the cache_dir).
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_tasks
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_tasks

from tasks import base
from tasks import models
from tasks import registry
from tasks import tff_data

_SO = tff.simulation.baselines.stackoverflow
WORD_VOCAB_SIZE = _SO.DEFAULT_WORD_VOCAB_SIZE   # 10,000
TAG_VOCAB_SIZE = _SO.DEFAULT_TAG_VOCAB_SIZE     # 500
SEQUENCE_LENGTH = _SO.DEFAULT_SEQUENCE_LENGTH   # 20
NUM_OOV_BUCKETS = 1                             # TFF's default
TAG_EVAL_BATCH_SIZE = 100  # TFF's default evaluation batch of the tag task


def _vocab(kind: str, size: int, options: registry.TaskOptions) -> list[str]:
  if options.use_synthetic_data:
    counts = (tff.simulation.datasets.stackoverflow.get_synthetic_word_counts()
              if kind == 'word' else
              tff.simulation.datasets.stackoverflow.get_synthetic_tag_counts())
    return list(counts)[:size]
  return tff_data.stackoverflow_vocab(kind, size, options.cache_dir)


def _finish(name: str, baseline, raw: tff_data.RawData, train, model: str,
            model_fn=None, **info) -> base.Task:
  datasets = baseline.datasets
  return tff_data.baseline_task(name, raw, train, model, datasets.train_preprocess_fn,
                                model_fn or baseline.model_fn,
                                datasets.eval_preprocess_fn, **info)


def code_bag_of_words(word_vocab: list[str], tag_vocab: list[str]):
  """Reddi et al.'s features (google-research/federated,
  utils/datasets/stackoverflow_lr_dataset.py, `build_to_ids_fn`): the words of
  tokens + title one-hot over the vocabulary and one OOV bucket, averaged over
  ALL the words, the OOV column then dropped, so a vector sums to the
  in-vocabulary fraction of its words (TFF's baseline divides by the
  in-vocabulary count: it sums to 1). Tags: a multi-hot over the tag vocabulary,
  as TFF's."""
  def table(vocab):
    return tf.lookup.StaticVocabularyTable(tf.lookup.KeyValueTensorInitializer(
        vocab, tf.range(len(vocab), dtype=tf.int64)), num_oov_buckets=1)
  words_table, tags_table = table(word_vocab), table(tag_vocab)

  def to_ids(example):
    words = tf.strings.split(tf.strings.join([example['tokens'], example['title']],
                                             separator=' '))
    words = tf.one_hot(words_table.lookup(words), len(word_vocab) + 1)
    tags = tf.one_hot(tags_table.lookup(tf.strings.split(example['tags'], sep='|')),
                      len(tag_vocab) + 1)
    return (tf.reduce_mean(words, axis=0)[:len(word_vocab)],
            tf.reduce_sum(tags, axis=0)[:len(tag_vocab)])
  return to_ids


def _tag_mean_loss_model_fn(word_vocab_size: int, tag_vocab_size: int, element_spec):
  """TFF's tag model and metrics with binary CE averaged over the batch."""
  return base.keras_model_fn(
      lambda: models.stackoverflow_tag_logreg(word_vocab_size, tag_vocab_size),
      element_spec, lambda: tf.keras.losses.BinaryCrossentropy(from_logits=False),
      lambda: [tf.keras.metrics.Precision(name='precision'),
               tf.keras.metrics.Recall(top_k=5, name='recall_at_5')])


def build_tag(options: registry.TaskOptions) -> base.Task:
  raw = tff_data.load('stackoverflow', options.cache_dir,
                      options.use_synthetic_data)
  word_vocab = _vocab('word', WORD_VOCAB_SIZE, options)
  tag_vocab = _vocab('tag', TAG_VOCAB_SIZE, options)
  train = tff_data.select_clients(raw.train, options.num_clients, options.seed)
  baseline = tag_prediction_tasks.create_tag_prediction_task_from_datasets(
      train_client_spec=tff_data.train_client_spec(options.batch_size),
      eval_client_spec=None, word_vocab=word_vocab, tag_vocab=tag_vocab,
      train_data=train, test_data=raw.test, validation_data=raw.validation)
  model = options.model or 'logreg'
  model_fn = None
  if model == 'logreg_mean':
    model_fn = _tag_mean_loss_model_fn(len(word_vocab), len(tag_vocab),
                                       baseline.datasets.element_type_structure)
  info = dict(word_vocab_size=len(word_vocab), tag_vocab_size=len(tag_vocab),
              eval_batch_size=TAG_EVAL_BATCH_SIZE)
  if model == 'logreg_code':
    to_ids = code_bag_of_words(word_vocab, tag_vocab)
    batches = lambda size: lambda ds: ds.map(to_ids).batch(size)  # noqa: E731
    return tff_data.baseline_task(
        'stackoverflow_tag', raw, train, model, batches(options.batch_size),
        baseline.model_fn, batches(TAG_EVAL_BATCH_SIZE),
        features='mean of one-hot words over all words, OOV column dropped '
                 "(Reddi et al.'s code)", **info)
  return _finish('stackoverflow_tag', baseline, raw, train, model, model_fn, **info)


def build_word(options: registry.TaskOptions) -> base.Task:
  raw = tff_data.load('stackoverflow', options.cache_dir,
                      options.use_synthetic_data)
  vocab = _vocab('word', WORD_VOCAB_SIZE, options)
  train = tff_data.select_clients(raw.train, options.num_clients, options.seed)
  baseline = word_prediction_tasks.create_word_prediction_task_from_datasets(
      train_client_spec=tff_data.train_client_spec(options.batch_size),
      eval_client_spec=None, sequence_length=SEQUENCE_LENGTH, vocab=vocab,
      num_out_of_vocab_buckets=NUM_OOV_BUCKETS, train_data=train,
      test_data=raw.test, validation_data=raw.validation)
  special = word_prediction_preprocessing.get_special_tokens(
      len(vocab), num_out_of_vocab_buckets=NUM_OOV_BUCKETS)
  return _finish('stackoverflow_word', baseline, raw, train, 'lstm',
                 vocab_size=len(vocab),
                 extended_vocab_size=(len(vocab) +
                                      special.get_number_of_special_tokens()),
                 sequence_length=SEQUENCE_LENGTH, eval_batch_size=64)
