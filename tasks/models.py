"""Keras model builders for the TFF-backed tasks.

Two kinds of builders live here:

* the models of papers 000 and 004 that TFF does not ship (`femnist_cnn`,
  `cifar_cnn_004`, `shakespeare_gru`); they output LOGITS, so pair them with a
  `from_logits=True` loss;
* thin wrappers that call TFF's own builders for TFF's baseline models (EMNIST
  'cnn_dropout'/'cnn'/'2nn', the Shakespeare LSTM, the StackOverflow word LSTM
  and tag logistic regression, CIFAR-100 ResNet-18 with GroupNorm). TFF's EMNIST
  models, the tag model and the ResNets end in softmax/sigmoid (TFF pairs them
  with `from_logits=False` losses); the two TFF recurrent models output logits.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

# TFF 0.87 exposes these builders only through its internal module paths.
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_models
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_tasks
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_models
from tensorflow_federated.python.simulation.models import resnet_models

EMNIST_TFF_MODELS = ('cnn_dropout', 'cnn', '2nn')


def conv_pool_net(input_shape: Sequence[int], num_classes: int, name: str,
                  filters: Sequence[int] = (32, 64), kernel: int = 3,
                  hidden: Sequence[int] = (512,)) -> tf.keras.Model:
  """Per entry of `filters`: Conv(kernel x kernel, 'valid')-ReLU-MaxPool2; then
  flattened, a ReLU FC layer per entry of `hidden`, and FC(classes) logits."""
  layers = [tf.keras.Input(shape=tuple(input_shape))]
  for width in filters:
    layers += [tf.keras.layers.Conv2D(width, kernel, activation='relu'),
               tf.keras.layers.MaxPool2D(2)]
  layers.append(tf.keras.layers.Flatten())
  layers += [tf.keras.layers.Dense(width, activation='relu') for width in hidden]
  layers.append(tf.keras.layers.Dense(num_classes))  # logits
  return tf.keras.Sequential(layers, name=name)


def femnist_cnn(num_classes: int = 62) -> tf.keras.Model:
  """The FEMNIST CNN of papers 000/004 on 28x28x1 inputs (logits output).

  Padding is 'valid' (PyTorch's default, as in the FedGBO reference code whose
  first dense layer takes 1600 = 5*5*64 inputs): 28 -> 26 -> 13 -> 11 -> 5.
  With 62 classes it has 870,334 parameters.
  """
  return conv_pool_net((28, 28, 1), num_classes, name='femnist_cnn')


def cifar_cnn_004(num_classes: int = 100, size: int = 28) -> tf.keras.Model:
  """Paper 004's CIFAR-100 CNN: `femnist_cnn`'s layers on size x size x 3 images:
  28x28 crops (the paper's text; first dense layer 5*5*64 = 1600 inputs) or whole
  32x32 images (the authors' code, whose first dense layer takes 6*6*64 = 2304)."""
  return conv_pool_net((size, size, 3), num_classes, name='cifar_cnn_004')


def shakespeare_gru(vocab_size: int, units: int = 256, embedding_dim: int = 8,
                    num_layers: int = 2) -> tf.keras.Model:
  """Embedding -> `num_layers` stacked GRUs -> Dense(vocab) logits per step.

  Paper 000 uses 256 units, paper 004 128. Token 0 is padding and is masked, as
  in TFF's Shakespeare LSTM, so padded steps do not count in the loss.
  """
  layers = [
      tf.keras.Input(shape=(None,), dtype=tf.int64),
      tf.keras.layers.Embedding(vocab_size, embedding_dim, mask_zero=True),
  ]
  layers += [tf.keras.layers.GRU(units, return_sequences=True)
             for _ in range(num_layers)]
  layers.append(tf.keras.layers.Dense(vocab_size))  # logits
  return tf.keras.Sequential(layers, name=f'shakespeare_gru{units}')


# ----------------------------------------------------------- TFF's own models


def emnist_tff_model(model_id: str, num_classes: int = 62) -> tf.keras.Model:
  """TFF's EMNIST model 'cnn_dropout', 'cnn' or '2nn' (softmax output)."""
  if num_classes not in (10, 62):
    raise ValueError(f'EMNIST has 10 or 62 classes, got {num_classes}')
  only_digits = num_classes == 10
  builders = {
      'cnn_dropout': emnist_models.create_conv_dropout_model,
      'cnn': emnist_models.create_original_fedavg_cnn_model,
      '2nn': emnist_models.create_two_hidden_layer_model,
  }
  if model_id not in builders:
    raise ValueError(f'unknown EMNIST model {model_id!r}; '
                     f'choose one of {", ".join(builders)}')
  return builders[model_id](only_digits=only_digits)


def shakespeare_lstm(vocab_size: int, sequence_length: int = 80
                     ) -> tf.keras.Model:
  """TFF's Shakespeare model: Embedding 8, 2 x LSTM 256, Dense logits."""
  return char_prediction_models.create_recurrent_model(
      vocab_size=vocab_size, sequence_length=sequence_length)


def stackoverflow_word_lstm(extended_vocab_size: int) -> tf.keras.Model:
  """TFF's StackOverflow next-word LSTM with TFF's default sizes (logits)."""
  return word_prediction_models.create_recurrent_model(
      vocab_size=extended_vocab_size)


def stackoverflow_tag_logreg(word_vocab_size: int, tag_vocab_size: int
                             ) -> tf.keras.Model:
  """TFF's 1-vs-rest logistic regression for StackOverflow tags (sigmoid)."""
  # pylint: disable=protected-access
  return tag_prediction_tasks._build_logistic_regression_model(
      input_size=word_vocab_size, output_size=tag_vocab_size)


def cifar_resnet18(input_shape: Sequence[int] = (24, 24, 3),
                   num_classes: int = 100, groups: Optional[int] = None) -> tf.keras.Model:
  """TFF's CIFAR-100 ResNet-18 (GroupNorm instead of BatchNorm; softmax).
  `groups`: the GroupNorm layers' groups (None: TFF's, Keras's default 32;
  `regroup`)."""
  model = resnet_models.create_resnet18(
      input_shape=tuple(input_shape), num_classes=num_classes,
      norm_layer=resnet_models.NormLayer.GROUP_NORM)
  return model if groups is None else regroup(model, groups)


# Reddi et al.'s ResNet-18 (google-research/federated, utils/models/resnet_models.py)
# normalises with `tfa.layers.GroupNormalization(axis=...)` at the TensorFlow Addons
# default of its time, groups=2 (32 only from tensorflow/addons#2241, Nov. 2020);
# TFF's copy uses Keras's GroupNormalization, default 32.
REDDI_GN_GROUPS = 2


def regroup(model: tf.keras.Model, groups: int) -> tf.keras.Model:
  """`model` rebuilt (fresh weights) with every GroupNormalization at `groups`
  groups; its scale and offset keep their shapes, one value per channel."""
  config = model.get_config()
  for layer in config['layers']:
    if layer['class_name'] == 'GroupNormalization':
      layer['config']['groups'] = groups
  return model.__class__.from_config(config)


# ------------------------------------------------ paper 003 (FedDyn) models


def mlp(hidden: Sequence[int], input_dim: int = 784, num_classes: int = 10,
        name: Optional[str] = None) -> tf.keras.Model:
  """Flattened input -> FC(h)-ReLU for each h of `hidden` -> FC(classes) logits."""
  return tf.keras.Sequential(
      [tf.keras.Input(shape=(input_dim,))]
      + [tf.keras.layers.Dense(h, activation='relu') for h in hidden]
      + [tf.keras.layers.Dense(num_classes)],  # logits
      name=name or 'mlp_' + '_'.join(str(h) for h in hidden))


# Paper 003's MLPs (App. A.2: "2 hidden layers ... 200 and 100 for MNIST and
# EMNIST-L respectively"; MNIST's is "the same model used in original FedAvg
# work", the 2NN of 200-200; the authors' code, utils_models.py: 784-200-200-10
# for 'mnist', 784-100-100-10 for 'emnist'). `mlp_200_100` is the main text's
# other reading ("the number of neurons in the layers are 200 and 100"), kept
# as an option and as the offline digits task's net.
MLP_003 = {'mlp_200_200': (200, 200), 'mlp_100_100': (100, 100), 'mlp_200_100': (200, 100)}


def mlp_200_100(input_dim: int = 784, num_classes: int = 10) -> tf.keras.Model:
  """FC200-ReLU -> FC100-ReLU -> logits: 178,110 parameters on 784 inputs and
  10 classes (the digits task's net; see `MLP_003`)."""
  return mlp((200, 100), input_dim, num_classes)


# Paper 003's CIFAR CNN's first FC layer: the text (App. A.2) says 394 units, the
# authors' code (utils_models.py) 384: model 'cnn003_text' (the configs') / 'cnn003'.
CNN_003_UNITS = {'cnn003_text': 394, 'cnn003': 384}


def cifar_cnn_003(num_classes: int = 10, input_shape: Sequence[int] = (32, 32, 3),
                  units: int = 384) -> tf.keras.Model:
  """Paper 003's CIFAR CNN: 2 x [conv5x5(64) 'valid' -ReLU- maxpool2] ->
  FC`units`-ReLU -> FC192-ReLU -> FC(classes) logits, no batch norm
  (`CNN_003_UNITS`). 32x32 -> 28 -> 14 -> 10 -> 5, so the first FC layer takes
  1,600 inputs: 797,962 parameters with 10 classes and 384 units."""
  return conv_pool_net(input_shape, num_classes, 'cifar_cnn_003', filters=(64, 64),
                       kernel=5, hidden=(units, 192))


def shakespeare_lstm_003(vocab_size: int, units: int = 100, embedding_dim: int = 8,
                         return_sequences: bool = True) -> tf.keras.Model:
  """Paper 003's (= FedProx's) Shakespeare model: Embedding 8 -> 2 x LSTM(100)
  -> Dense(vocab) logits. The paper predicts the character after an 80-char
  window from the last step (`return_sequences=False`); with True it emits
  logits at every step, the target layout of TFF's Shakespeare pipeline.
  Token 0 (padding) is masked."""
  return tf.keras.Sequential([
      tf.keras.Input(shape=(None,), dtype=tf.int64),
      tf.keras.layers.Embedding(vocab_size, embedding_dim, mask_zero=True),
      tf.keras.layers.LSTM(units, return_sequences=True),
      tf.keras.layers.LSTM(units, return_sequences=return_sequences),
      tf.keras.layers.Dense(vocab_size),  # logits
  ], name=f'shakespeare_lstm{units}')
