"""The one-dimensional quadratic toy of paper 000 §3, vectorised over runs.

Client identity z lies in [1, 3] with density proportional to z^{-1/2}; a client
holds the single point z and loss f(x; z) = 1/2 z x^2 - x (local minimiser 1/z).
The population objective E_z f(x; z) is minimised by
x* = int z^{-1/2} / int z^{1/2} = 0.52337; FedAvg with K local steps of size
gamma instead settles at the surrogate minimiser x*(gamma, K) = E[phi/z]/E[phi],
phi(z) = 1 - (1 - gamma z)^K (paper 002; `surrogate_minimiser`).

Independent repetitions (seeds) are the coordinates of one model vector: the
model x has `num_runs` entries, a client holds z in R^{num_runs} (independent
draws), and the loss is the sum over runs, so gradients, SGD and every
element-wise server optimiser act on each coordinate exactly as S separate
runs would, at the cost of one.
"""

from __future__ import annotations

import collections

import numpy as np
from scipy import integrate
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import catalog
from tasks import partition
from tasks.options import TaskOptions

Z_LOW, Z_HIGH = 1.0, 3.0
X_INIT = 0.4
DEFAULT_CLIENTS = catalog.DEFAULT_CLIENTS['quadratic']


def sample_z(shape, rng: np.random.Generator) -> np.ndarray:
  """Inverse-CDF draws of density ~ z^{-1/2} on [1, 3]."""
  u = rng.random(shape)
  return (1.0 + u * (np.sqrt(Z_HIGH) - 1.0)) ** 2


def _expect(fn) -> float:
  num = integrate.quad(lambda z: fn(z) * z ** -0.5, Z_LOW, Z_HIGH, epsabs=1e-13,
                       epsrel=1e-13)[0]
  den = integrate.quad(lambda z: z ** -0.5, Z_LOW, Z_HIGH)[0]
  return num / den


def true_minimiser() -> float:
  return _expect(lambda z: 1.0) / _expect(lambda z: z)


def surrogate_minimiser(gamma: float, k: int) -> float:
  phi = lambda z: 1.0 - (1.0 - gamma * z) ** k
  return _expect(lambda z: phi(z) / z) / _expect(phi)


class QuadraticModel(base.MeanLossMetric, tff.learning.models.VariableModel):
  """x in R^S; batch {'z': [B, S]}; loss = mean_b sum_s (z x_s^2 / 2 - x_s)."""

  def __init__(self, num_runs: int, x_init: float = X_INIT):
    self._num_runs = num_runs
    self._x = tf.Variable(tf.fill([num_runs], tf.constant(x_init, tf.float32)),
                          name='x')
    self._init_loss_metric()

  @property
  def trainable_variables(self):
    return [self._x]

  @property
  def non_trainable_variables(self):
    return []

  @property
  def input_spec(self):
    return collections.OrderedDict(
        z=tf.TensorSpec([None, self._num_runs], tf.float32))

  @tf.function(autograph=False)
  def predict_on_batch(self, x, training=True):
    del training
    return x * self._x  # z * x: the gradient's data term

  @tf.function(autograph=False)
  def forward_pass(self, batch_input, training=True):
    z = batch_input['z']
    loss = _loss(self._x, z)
    n = tf.shape(z)[0]
    self._record_loss(loss * tf.cast(n, tf.float32) / self._num_runs, n)
    return tff.learning.models.BatchOutput(
        loss=loss, predictions=self.predict_on_batch(z), num_examples=n)


def _loss(x, z):
  """mean_b sum_s (z_bs x_s^2 / 2 - x_s) of a batch z [B, S], with its gradient
  in x written out: mean_b (z x - 1).

  As `_lane_loss` (which see): 5 ops for a gradient that autodiff, with the
  batch size unknown when tracing, makes ~50 (~a third of a toy client's
  graph), and the same bits for batches of one example (the toy's).
  """
  @tf.custom_gradient
  def loss_fn(x):
    per_run = 0.5 * z * tf.square(x) - x      # [B, S]
    loss = tf.reduce_mean(tf.reduce_sum(per_run, axis=1))

    def grad(upstream):
      return upstream * tf.reduce_mean(z * x - 1.0, axis=0)
    return loss, grad
  return loss_fn(x)


def build(options: TaskOptions) -> base.Task:
  """One client = one point (batch size 1); `options.num_runs` repetitions."""
  return build_quadratic(num_runs=options.num_runs,
                         num_clients=options.num_clients or DEFAULT_CLIENTS,
                         seed=options.seed)


def population(num_runs: int, num_clients: int, seed: int) -> np.ndarray:
  """The clients' points, [num_clients, num_runs] float32 (client k, run s)."""
  rng = np.random.default_rng(seed)
  return sample_z((num_clients, 1, num_runs), rng).astype(np.float32)[:, 0, :]


def build_quadratic(num_runs: int = 1, num_clients: int = DEFAULT_CLIENTS,
                    seed: int = 0, x_init: float = X_INIT) -> base.Task:
  z = population(num_runs, num_clients, seed)[:, None, :]
  train = partition.to_client_data(collections.OrderedDict(z=z),
                                   [np.array([k]) for k in range(num_clients)])
  return base.Task(
      name='quadratic', train_data=train,
      preprocess_fn=lambda ds: ds,  # each client's single row is already a batch
      model_fn=lambda: QuadraticModel(num_runs, x_init), shuffle=False,
      info=dict(model='scalar', num_train_clients=num_clients, num_runs=num_runs,
                x_star=true_minimiser(), source='generated'))


class LaneQuadraticModel(base.MeanLossMetric, tff.learning.models.VariableModel):
  """Lanes x runs: x in R^{L x S}; batch {'z': [B, S], 'active': [B, L]}.

  loss = mean_b sum_{l,s} active[b, l] (z[b, s] x[l, s]^2 / 2 - x[l, s]).
  Lane l is one configuration (e.g. a schedule of paper 000's Figure 1), each
  with the same S runs. A step whose batch has active[b, l] = 0 gives lane l
  a gradient of exactly 0, so client SGD leaves the lane where it is: a
  client's dataset of K_max batches in which lane l is active in the first K_l
  runs K_l local steps in lane l, every lane in one local loop. An active
  lane's gradient (z x - 1) is computed by the same operations as
  `QuadraticModel`'s, so each lane follows its separate run exactly.
  """

  def __init__(self, num_lanes: int, num_runs: int, x_init: float = X_INIT):
    self._num_lanes, self._num_runs = num_lanes, num_runs
    self._x = tf.Variable(tf.fill([num_lanes, num_runs], tf.constant(x_init, tf.float32)),
                          name='x')
    self._init_loss_metric()

  trainable_variables = property(lambda self: [self._x])
  non_trainable_variables = property(lambda self: [])

  @property
  def input_spec(self):
    return collections.OrderedDict(
        z=tf.TensorSpec([None, self._num_runs], tf.float32),
        active=tf.TensorSpec([None, self._num_lanes], tf.float32))

  def predict_on_batch(self, x, training=True):
    del training
    return x[:, None, :] * self._x  # z * x: the gradient's data term, per lane

  # Not a tf.function: its few ops then sit in the local loop's body instead
  # of two function calls (forward and backward) per local step.
  def forward_pass(self, batch_input, training=True):
    z = batch_input['z'][:, None, :]                          # [B, 1, S]
    active = batch_input['active'][:, :, None]                # [B, L, 1]
    loss = _lane_loss(self._x, z, active)
    n = tf.shape(z)[0]
    self._record_loss(loss * tf.cast(n, tf.float32) / self._num_runs, n)
    return tff.learning.models.BatchOutput(loss=loss, predictions=z, num_examples=n)


def _lane_loss(x, z, active):
  """mean_b sum_{l,s} active (z x^2 / 2 - x), with its gradient in x written
  out: mean_b active (z x - 1).

  The written-out gradient is 5 TensorFlow ops where autodiff's, with the batch
  size unknown when tracing, is ~50 (shapes, broadcast-gradient reductions, the
  mean's tiling): most of a local step of the toy (docs/performance.md). Its
  values are the same bits for batches of one example (the toy's): autodiff
  computes ((active * 0.5 z) (2 x)) + (-active), and scaling by 0.5 and 2 is
  exact in floating point, so both give active * fl(fl(z x) - 1).
  """
  @tf.custom_gradient
  def loss_fn(x):
    per_run = active * (0.5 * z * tf.square(x) - x)  # [B, L, S]
    loss = tf.reduce_mean(tf.reduce_sum(per_run, axis=[1, 2]))

    def grad(upstream):
      return upstream * tf.reduce_mean(active * (z * x - 1.0), axis=0)
    return loss, grad
  return loss_fn(x)


def lane_client_dataset(z, lane_steps) -> tf.data.Dataset:
  """A client holding the point z ([S]) for lanes taking `lane_steps[l]` local
  steps: max(lane_steps) batches of one example, lane l active in the first
  lane_steps[l] of them (`LaneQuadraticModel`). Eager or inside a computation."""
  z = tf.convert_to_tensor(z, tf.float32)
  lane_steps = tf.convert_to_tensor(lane_steps, tf.int32)
  steps = tf.reduce_max(lane_steps)
  active = tf.cast(tf.range(steps)[:, None] < lane_steps[None, :], tf.float32)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      z=tf.broadcast_to(z[None, None, :], tf.stack([steps, 1, z.shape[0]])),
      active=active[:, None, :]))


class QuadraticFormModel(base.MeanLossMetric, tff.learning.models.VariableModel):
  """x in R^d; example (A, c); loss 1/2 (x - c)^T A (x - c), batch-averaged.

  With one example per client, a client's minibatch gradient is its full
  gradient A_i (x - c_i): the setting of paper 002's exact quadratic theory.
  """

  def __init__(self, dim: int, x_init=None):
    init = np.zeros(dim, np.float32) if x_init is None else np.asarray(x_init, np.float32)
    self._dim = dim
    self._x = tf.Variable(init, name='x')
    self._init_loss_metric()

  trainable_variables = property(lambda self: [self._x])
  non_trainable_variables = property(lambda self: [])

  @property
  def input_spec(self):
    return collections.OrderedDict(
        A=tf.TensorSpec([None, self._dim, self._dim], tf.float32),
        c=tf.TensorSpec([None, self._dim], tf.float32))

  @tf.function(autograph=False)
  def predict_on_batch(self, x, training=True):
    del training
    return x

  @tf.function(autograph=False)
  def forward_pass(self, batch_input, training=True):
    r = self._x[None, :] - batch_input['c']                        # [B, d]
    per = 0.5 * tf.einsum('bi,bij,bj->b', r, batch_input['A'], r)  # [B]
    loss = tf.reduce_mean(per)
    n = tf.shape(r)[0]
    self._record_loss(tf.reduce_sum(per), n)
    return tff.learning.models.BatchOutput(loss=loss, predictions=r, num_examples=n)


def build_quadratic_form(a: np.ndarray, c: np.ndarray, x_init=None) -> base.Task:
  """Client i holds the single example (a[i], c[i]) (a: [N, d, d], c: [N, d])."""
  a = np.asarray(a, np.float32)
  c = np.asarray(c, np.float32)
  dim = c.shape[1]
  train = partition.to_client_data(collections.OrderedDict(A=a, c=c),
                                   [np.array([k]) for k in range(len(c))])
  return base.Task(name='quadratic_form', train_data=train,
                   preprocess_fn=lambda ds: ds.batch(1),
                   model_fn=lambda: QuadraticFormModel(dim, x_init), shuffle=False,
                   info=dict(model='quadratic_form', num_train_clients=len(c), dim=dim,
                             source='generated'))
