"""Mimelite and MimeXlite: global statistics tracked with client gradients at x_t.

Mimelite: Karimireddy et al., "Breaking the centralized barrier for
cross-device federated learning" (NeurIPS 2021), as compared in paper 004
(Mills et al., FedGBO); MimeXlite is paper 004's variant. Round t:

  client i:  download x_t and s_t
             c_i = grad f_i(x_t) on the whole local dataset   (Mimelite)
                 = one minibatch gradient at x_t              (MimeXlite)
             y_0 = x_t;  y_k = y_{k-1} - U(eta, g_k, s_t)     (s_t FIXED)
             upload y_K (as Delta_i = x_t - y_K) and c_i
  server:    x_{t+1} = ServerOpt(x_t, mean_i Delta_i)      (SGD at 1: mean_i y_K^i)
             s_{t+1} = T(mean_i c_i, s_t)

Download x + s, upload x + grad f (Table 1). U and T are FedGBO's
(`gbo.optimizers`: SGDm m <- beta m + (1-beta) g, RMSProp, Adam), so
Mimelite and FedGBO differ only in where the tracked gradient comes from.
Means are weighted by n_i (or uniform). The full-batch gradient is the
example-weighted mean of the batch-mean gradients, computed before training
on the same model (forward pass with training=True), as TFF's
`tff.learning.algorithms.build_weighted_mime_lite` does. TFF's SGDm has no
(1 - beta) dampening: our SGDm(eta, beta) is TFF's sgdm(eta (1 - beta), beta)
with m_TFF = m / (1 - beta) (tested).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.algorithms.fedgbo import process as fedgbo
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.algorithms.gbo import statistics as global_statistics
from tff_algos.algorithms.mime.config import ONE_BATCH, MimeConfig
from tff_algos.core import accounting
from tff_algos.core import local_training
from tff_algos.core.algorithm import FederatedAlgorithm
from tff_algos.core.composition import compose

def mean_gradient(model: tff.learning.models.VariableModel, weights,
                  dataset: tf.data.Dataset):
  """Example-weighted mean gradient of the loss at `weights` over `dataset`.

  Leaves the model's metrics reset (they then count training only).
  """
  local_training.assign_weights(model, weights)
  trainable = model.trainable_variables

  def add(carry, batch):
    total, count = carry
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    n = local_training.batch_examples(output)
    grads = tape.gradient(output.loss, trainable)
    return tuple(t + g * tf.cast(n, g.dtype) for t, g in zip(total, grads)), count + n

  total, count = local_training.fold(
      dataset, (tuple(tf.zeros_like(v) for v in trainable), tf.constant(0, tf.int64)), add)
  model.reset_metrics()
  mean = [tf.math.divide_no_nan(t, tf.cast(count, t.dtype)) for t in total]
  return tf.nest.pack_sequence_as(weights.trainable, mean)


def build_mime(model_fn: Callable[[], tff.learning.models.VariableModel],
               config: MimeConfig = MimeConfig(),
               name: Optional[str] = None) -> FederatedAlgorithm:
  rule = gbo_optimizers.of_config(config)
  one_batch = config.gradient == ONE_BATCH

  def client_fn(model, hparams, statistics, initial_weights, dataset):
    gradient = mean_gradient(model, initial_weights,
                             dataset.take(1) if one_batch else dataset)
    outcome, _ = fedgbo.fixed_statistics_training(rule)(
        model, hparams, statistics, initial_weights, dataset)
    return outcome, gradient

  def server_fn(statistics, hparams, mean_delta, mean_grad):
    del hparams, mean_delta
    return rule.track(statistics, mean_grad)

  work = global_statistics.build_statistics_client_work(
      model_fn, config.client_schedule(), rule.initialize, client_fn, server_fn,
      server_uses_delta=False,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM if config.plain_mean
                        else tff.learning.ClientWeighting.NUM_EXAMPLES))
  name = name or ('mimexlite' if one_batch else 'mimelite')
  algorithm = compose(name, model_fn, work, config.server_optimizer_spec().build())
  return dataclasses.replace(algorithm, compute=accounting.ComputeModel(
      optimizer_flops_per_param=rule.flops_fixed, extra_gradient=config.gradient))
