"""A heterogeneous least-squares federated problem with a closed-form optimum.

Client k holds (X_k, y_k) and L_k(w) = 1/2 mean_i (x_i . w - y_i)^2, i.e.
grad L_k(w) = H_k w - c_k with H_k = X_k^T X_k / n_k, c_k = X_k^T y_k / n_k.
The global objective sum_k L_k is minimised by w* = (sum H_k)^-1 sum c_k,
while each client's own minimiser H_k^-1 c_k differs (client drift).
Each client's data is ONE full batch, so a local step is a full gradient step.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base


class LeastSquaresModel(base.MeanLossMetric, base.PlainModel):
  """w in R^d (no bias); batch {'x': [B, d], 'y': [B]}."""

  def __init__(self, dim: int):
    self._w = tf.Variable(tf.zeros([dim]), name='w')
    self._init_loss_metric()
    self._weights = [self._w]
    self._input_spec = collections.OrderedDict(x=tf.TensorSpec([None, dim], tf.float32),
                                               y=tf.TensorSpec([None], tf.float32))

  @tf.function
  def predict_on_batch(self, x, training=True):
    del training
    return tf.linalg.matvec(x, self._w)

  @tf.function
  def forward_pass(self, batch, training=True):
    pred = self.predict_on_batch(batch['x'])
    n = tf.shape(pred)[0]
    loss = 0.5 * tf.reduce_mean(tf.square(pred - batch['y']))
    self._record_loss(loss * tf.cast(n, tf.float32), n)
    return tff.learning.models.BatchOutput(loss=loss, predictions=pred,
                                           num_examples=n)


class Problem:
  def __init__(self, num_clients=4, n=8, dim=3, seed=0, spread=0.3, sizes=None):
    rng = np.random.default_rng(seed)
    self.dim = dim
    sizes = sizes or [n] * num_clients
    self.X = [(rng.normal(size=(nk, dim)) * (1 + spread * k)).astype(np.float32)
              for k, nk in enumerate(sizes)]
    self.Y = [(x @ rng.normal(size=dim) + rng.normal(size=len(x)) + 3 * k
               ).astype(np.float32) for k, x in enumerate(self.X)]
    self.H = [x.astype(np.float64).T @ x / len(x) for x in self.X]
    self.C = [x.astype(np.float64).T @ y / len(x) for x, y in zip(self.X, self.Y)]
    self.optimum = np.linalg.solve(sum(self.H), sum(self.C))

  @property
  def num_clients(self):
    return len(self.X)

  def model_fn(self):
    return LeastSquaresModel(self.dim)

  def grad(self, k, w):
    return self.H[k] @ w - self.C[k]

  def dataset(self, k, batch_size=None):
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=self.X[k], y=self.Y[k])).batch(batch_size or len(self.Y[k]))

  def datasets(self, clients=None, batch_size=None):
    clients = range(self.num_clients) if clients is None else clients
    return [self.dataset(k, batch_size) for k in clients]

  def batch_grad(self, k, w, start, stop):
    """Gradient of the mean loss over examples [start, stop) of client k."""
    x = self.X[k][start:stop].astype(np.float64)
    y = self.Y[k][start:stop].astype(np.float64)
    return x.T @ (x @ w - y) / len(y)

  def weights(self, w):
    return tff.learning.models.ModelWeights(trainable=[np.asarray(w, np.float32)],
                                            non_trainable=[])


def run_stateful(process, problem, cohorts, theta0, population=None, batch_size=None):
  """Runs `cohorts` (lists of client indices) of a stateful-client process,
  keeping the client states in a dict; returns (server state, client states)."""
  from tff_algos.core.stateful_process import Population
  state = process.initialize(population or Population(problem.num_clients))
  state = process.set_model_weights(state, problem.weights(theta0))
  initial = process.initial_client_state(state)
  states = {k: initial for k in range(problem.num_clients)}
  for cohort in cohorts:
    out = process.next(state, problem.datasets(cohort, batch_size),
                       [states[k] for k in cohort])
    state = out.state
    states.update(zip(cohort, out.client_states))
  return state, states


def model(process, state):
  return np.asarray(process.get_model_weights(state).trainable[0], np.float64)

