"""FedMAX: FedAvg with a maximum-entropy term on the penultimate activations.

Chen, Bhardwaj & Marculescu, "FedMAX: Mitigating Activation Divergence for
Accurate and Communication-Efficient Federated Learning" (ECML-PKDD 2020); a
baseline of paper 004 (Table 1: download x, upload x, vanilla client SGD).

Client i minimises, on each minibatch xi,

    f_i(y; xi) + beta * mean_{examples} KL( softmax(a(y; xi)) || U )

where a are the activations of the penultimate layer (the input of the model's
last layer) and U is uniform over their d units; KL(q || U) = log d - H(q), so
the term maximises the activations' entropy and makes client representations
agree. Everything else is FedAvg/FedOpt (`fedopt.build_fedopt`): the term
enters only through the model's training loss, as a Keras activity
regularizer on the penultimate layer (TFF's Keras wrapper adds `model.losses`
to the training loss; its reported `loss` metric stays the plain loss).
beta = 0 is FedAvg exactly.

`reference_kl=True` uses the direction of the authors' code instead,
KL(U || softmax(a)) (PyTorch `KLDivLoss(log_softmax(a), softmax(0))`, batch
mean); both vanish exactly at uniform activations.

Models: Keras-backed (`tff.learning.models.from_keras_model`) with a hidden
layer. The penultimate layer is the one named 'penultimate' if the Keras model
has one, else the layer feeding the last layer of a Sequential model (the
512-unit ReLU layer of the FEMNIST/CIFAR CNNs, the 128-unit hidden layer of
the digits MLP, the second GRU of the Shakespeare GRU: there the KL is per
time step, averaged over steps).
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fedmax.config import FedMaxConfig
from tff_algos.algorithms.fedopt import process as fedopt
from tff_algos.core.algorithm import FederatedAlgorithm

PENULTIMATE_LAYER_NAME = 'penultimate'


def max_entropy_kl(activations: tf.Tensor, reference_kl: bool = False) -> tf.Tensor:
  """Mean over examples (and time steps) of KL(softmax(a) || U) over the last
  axis, or of KL(U || softmax(a)) if `reference_kl`."""
  log_q = tf.nn.log_softmax(activations, axis=-1)
  log_d = tf.math.log(tf.cast(tf.shape(activations)[-1], log_q.dtype))
  if reference_kl:   # sum_j (1/d) (log(1/d) - log q_j)
    kl = -log_d - tf.reduce_mean(log_q, axis=-1)
  else:              # sum_j q_j (log q_j - log(1/d))
    kl = tf.reduce_sum(tf.exp(log_q) * log_q, axis=-1) + log_d
  return tf.reduce_mean(kl)


class MaxEntropyRegularizer(tf.keras.regularizers.Regularizer):
  """beta * max_entropy_kl as a Keras activity regularizer.

  Keras divides an activity regularizer's value by the batch size, so this
  returns batch_size * beta * (batch-mean KL).
  """

  def __init__(self, beta: float, reference_kl: bool = False):
    self.beta = beta
    self.reference_kl = reference_kl

  def __call__(self, activations):
    batch = tf.cast(tf.shape(activations)[0], activations.dtype)
    return batch * self.beta * max_entropy_kl(activations, self.reference_kl)

  def get_config(self):
    return dict(beta=self.beta, reference_kl=self.reference_kl)


def penultimate_layer(keras_model: tf.keras.Model) -> tf.keras.layers.Layer:
  """The layer whose output feeds the model's last layer (see module doc)."""
  for layer in keras_model.layers:
    if layer.name == PENULTIMATE_LAYER_NAME:
      return layer
  if isinstance(keras_model, tf.keras.Sequential) and len(keras_model.layers) >= 2:
    return keras_model.layers[-2]
  raise ValueError(
      f'FedMAX needs the penultimate activations: model {keras_model.name!r} has no '
      f'layer named {PENULTIMATE_LAYER_NAME!r} and is not a Sequential model with a '
      'hidden layer (FedMAX applies to DNNs, not to linear models)')


def fedmax_model_fn(model_fn, beta: float, reference_kl: bool = False):
  """`model_fn` whose model adds beta * KL on the penultimate activations to
  its training loss (a Keras-backed `tff.learning` model)."""

  def wrapped():
    model = model_fn()
    layer = penultimate_layer(_keras_of(model))
    if layer.activity_regularizer is not None:
      raise ValueError(f'penultimate layer {layer.name!r} already has an '
                       'activity regularizer')
    if beta:
      layer.activity_regularizer = MaxEntropyRegularizer(beta, reference_kl)
      # TFF's wrapper runs the Keras model in a nested tf.function
      # (`predict_on_batch`), out of whose graph the activity loss could not be
      # read; run it inline in `forward_pass` instead.
      keras_model = _keras_of(model)
      model.predict_on_batch = (
          lambda x, training=True: keras_model(x, training=training))
    return model

  return wrapped


def build_fedmax(model_fn, config: FedMaxConfig = FedMaxConfig(),
                 name: str = 'fedmax') -> FederatedAlgorithm:
  with tf.Graph().as_default():  # fail here, not inside TFF tracing
    penultimate_layer(_keras_of(model_fn()))
  return fedopt.build_fedopt(
      fedmax_model_fn(model_fn, config.beta, config.reference_kl), config, name=name)


def _keras_of(model: tff.learning.models.VariableModel) -> tf.keras.Model:
  keras_model = getattr(model, '_keras_model', None)  # TFF's Keras wrapper
  if keras_model is None:
    raise ValueError('FedMAX needs a Keras-backed model '
                     '(tff.learning.models.from_keras_model)')
  return keras_model
