"""`logistic`: l2-regularised logistic regression on LIBSVM data (paper 001).

Data: a LIBSVM-format file (`--libsvm_path`; the paper uses "mushrooms",
8,124 x 112, labels 1/2) or, by default and offline, scikit-learn's breast-cancer
set (569 x 30, labels 0/1), standardised, with a constant-1 column appended as
the intercept. Labels become b in {0, 1} (the smaller raw value -> 0); features
are dense float32, scaled as the file gives them. The examples are split over
N = `num_clients` clients (default 10): 'iid', label-'sorted' or 'dirichlet'.

Objective (client-uniform, as in the paper's f = 1/N sum_i f_i):

    f_i(x) = 1/n_i sum_{j in client i} [log(1 + exp(a_j.x)) - b_j a_j.x] + lam/2 ||x||^2

with lam = `l2_reg`, by default L0/n where L0 = lambda_max(A^T A)/(4n) is the
smoothness of the data term (condition number ~ n: the usual choice in the
Random Reshuffling experiments). The model has no separate bias.

The TFF model computes in float64 (weights and loss; features are cast), so
f(x_t) - f* is trackable to ~1e-12 and Nastya's (x_t - y_n)/(gamma n) keeps its
digits for gamma as small as 1e-6. `LogisticProblem` is the same objective in
numpy (loss, gradient, smoothness L, f* by Newton's method) for experiments.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import gzip
from typing import Optional

import numpy as np
from scipy import special
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import catalog
from tasks import partition
from tasks.options import TaskOptions

DEFAULT_CLIENTS = catalog.DEFAULT_CLIENTS['logistic']
EVAL_BATCH = 1000


# ---------------------------------------------------------------- LIBSVM files


def _open_text(path: str):
  if path.endswith('.bz2'):
    return bz2.open(path, 'rt')
  if path.endswith('.gz'):
    return gzip.open(path, 'rt')
  return open(path)


def parse_libsvm(path: str, num_features: Optional[int] = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Reads `label idx:value ...` lines (1-based indices) into dense arrays.

  Returns (features float32 [n, d], raw labels float64 [n]); d is the largest
  index seen, or `num_features`. Blank lines and '#' comments are skipped.
  """
  try:
    f = _open_text(path)
  except OSError as e:
    raise base.TaskError(
        f'cannot read LIBSVM file {path!r} ({e.strerror or e}); give --libsvm_path a '
        f'LIBSVM-format file (.bz2/.gz read as they are), e.g. the paper\'s mushrooms from '
        f'{catalog.LIBSVM_SOURCE}, or leave it out for the embedded breast-cancer set') from None
  labels, rows, cols, vals = [], [], [], []
  with f:
    for lineno, line in enumerate(f, 1):
      line = line.split('#', 1)[0].strip()
      if not line:
        continue
      tokens = line.split()
      try:
        labels.append(float(tokens[0]))
        for token in tokens[1:]:
          key, value = token.split(':', 1)
          if key == 'qid':
            continue
          index = int(key)
          if index < 1:
            raise ValueError(f'feature index {index} < 1')
          rows.append(len(labels) - 1)
          cols.append(index - 1)
          vals.append(float(value))
      except ValueError as e:
        raise base.TaskError(f'{path}:{lineno}: not LIBSVM format ({e}): '
                             f'{line[:80]!r}') from None
  if not labels:
    raise base.TaskError(f'LIBSVM file {path!r} has no examples')
  width = max(cols, default=-1) + 1
  if num_features is not None:
    if width > num_features:
      raise base.TaskError(f'{path}: feature index {width} > num_features={num_features}')
    width = num_features
  features = np.zeros((len(labels), width), np.float32)
  features[np.asarray(rows, np.int64), np.asarray(cols, np.int64)] = vals
  return features, np.asarray(labels, np.float64)


def binary_labels(raw: np.ndarray) -> np.ndarray:
  """Two raw label values (-1/+1, 0/1, 1/2, ...) -> int32 {0, 1}."""
  values = np.unique(raw)
  if len(values) != 2:
    raise base.TaskError(f'binary classification needs 2 label values, got '
                         f'{len(values)}: {values[:10].tolist()}')
  return (raw == values[1]).astype(np.int32)


def breast_cancer_arrays() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's breast-cancer set: standardised features + intercept column."""
  from sklearn import datasets  # local import: only this task needs it
  data = datasets.load_breast_cancer()
  x = data.data.astype(np.float64)
  x = (x - x.mean(axis=0)) / x.std(axis=0)
  x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
  return x.astype(np.float32), data.target.astype(np.int32)


def data_smoothness(features: np.ndarray) -> float:
  """L0 = lambda_max(A^T A) / (4 n): smoothness of the mean logistic loss."""
  a = np.asarray(features, np.float64)
  return float(np.linalg.eigvalsh(a.T @ a / len(a)).max() / 4.0)


# ------------------------------------------------------------ numpy objective


@dataclasses.dataclass(frozen=True)
class LogisticProblem:
  """f(x) = sum_j w_j [softplus(a_j.x) - b_j a_j.x] + lam/2 ||x||^2 (float64).

  `weights` w_j = 1/(N n_i) for an example of client i (sum 1): the
  client-uniform objective 1/N sum_i f_i that Nastya minimises.
  """

  features: np.ndarray
  labels: np.ndarray
  weights: np.ndarray
  l2_reg: float

  @classmethod
  def from_client_arrays(cls, clients: list[dict[str, np.ndarray]], l2_reg: float
                         ) -> 'LogisticProblem':
    n = len(clients)
    return cls(
        features=np.concatenate([c['x'] for c in clients]).astype(np.float64),
        labels=np.concatenate([c['y'] for c in clients]).astype(np.float64),
        weights=np.concatenate([np.full(len(c['y']), 1.0 / (n * len(c['y'])))
                                for c in clients]),
        l2_reg=float(l2_reg))

  def loss(self, x: np.ndarray) -> float:
    z = self.features @ x
    data = self.weights @ (np.logaddexp(0.0, z) - self.labels * z)
    return float(data + 0.5 * self.l2_reg * x @ x)

  def grad(self, x: np.ndarray) -> np.ndarray:
    z = self.features @ x
    return self.features.T @ (self.weights * (special.expit(z) - self.labels)) + (
        self.l2_reg * x)

  def hessian(self, x: np.ndarray) -> np.ndarray:
    s = special.expit(self.features @ x)
    h = (self.features.T * (self.weights * s * (1 - s))) @ self.features
    return h + self.l2_reg * np.eye(len(x))

  def smoothness(self) -> float:
    """L = lambda_max(A^T diag(w) A)/4 + lam."""
    a = self.features
    return float(np.linalg.eigvalsh((a.T * self.weights) @ a).max() / 4 + self.l2_reg)

  def solve(self, tol: float = 1e-12, max_iter: int = 100) -> tuple[np.ndarray, float]:
    """(x*, f*) by damped Newton from 0, to ||grad f|| <= tol."""
    x = np.zeros(self.features.shape[1])
    f = self.loss(x)
    for _ in range(max_iter):
      g = self.grad(x)
      if np.linalg.norm(g) <= tol:
        break
      step = np.linalg.solve(self.hessian(x), g)
      t = 1.0
      while True:  # Armijo backtracking; Newton steps are accepted near x*
        x_new = x - t * step
        f_new = self.loss(x_new)
        if f_new <= f - 1e-4 * t * (g @ step) or t < 1e-10:
          break
        t *= 0.5
      x, f = x_new, f_new
    return x, self.loss(x)


def problem_of(task: base.Task) -> LogisticProblem:
  """The numpy objective of a `logistic` task (same clients, same lambda)."""
  clients = [task.train_data.client_arrays(cid) for cid in task.client_ids]
  return LogisticProblem.from_client_arrays(clients, task.info['l2_reg'])


# ------------------------------------------------------------------ the model


class LogisticRegression(base.PlainModel):
  """x in R^d (float64, init 0); batch {'x': [B, d], 'y': [B]} with y in {0, 1}.

  loss = mean_b [softplus(a_b.x) - y_b a_b.x] + lam/2 ||x||^2; metrics: loss and
  binary accuracy (example-weighted), num_examples.
  """

  def __init__(self, num_features: int, l2_reg: float, dtype=tf.float64):
    self._l2 = l2_reg
    self._dtype = dtype
    self._w = tf.Variable(tf.zeros([num_features], dtype), name='w')
    self._loss_sum = tf.Variable(tf.zeros([], dtype), trainable=False)
    self._correct = tf.Variable(tf.zeros([], dtype), trainable=False)
    self._count = tf.Variable(tf.zeros([], dtype), trainable=False)
    self._weights = [self._w]
    self._metric_variables = [self._loss_sum, self._correct, self._count]
    self._input_spec = collections.OrderedDict(
        x=tf.TensorSpec([None, num_features], tf.float32), y=tf.TensorSpec([None], tf.int32))

  @tf.function(autograph=False)
  def predict_on_batch(self, x, training=True):
    del training
    return tf.sigmoid(tf.linalg.matvec(tf.cast(x, self._dtype), self._w))

  @tf.function(autograph=False)
  def forward_pass(self, batch_input, training=True):
    del training
    logits = tf.linalg.matvec(tf.cast(batch_input['x'], self._dtype), self._w)
    y = tf.cast(batch_input['y'], self._dtype)
    data_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
    loss = data_loss + 0.5 * self._l2 * tf.reduce_sum(tf.square(self._w))
    n = tf.shape(y)[0]
    nf = tf.cast(n, self._dtype)
    self._loss_sum.assign_add(loss * nf)
    self._correct.assign_add(tf.reduce_sum(tf.cast(
        tf.equal(tf.cast(logits > 0, self._dtype), y), self._dtype)))
    self._count.assign_add(nf)
    return tff.learning.models.BatchOutput(
        loss=loss, predictions=tf.sigmoid(logits), num_examples=n)

  @tf.function(autograph=False)
  def report_local_unfinalized_metrics(self):
    return collections.OrderedDict(
        loss=[self._loss_sum, self._count],
        binary_accuracy=[self._correct, self._count],
        num_examples=self._count)

  def metric_finalizers(self):
    ratio = tf.function(lambda v: tf.math.divide_no_nan(v[0], v[1]), autograph=False)
    return collections.OrderedDict(loss=ratio, binary_accuracy=ratio,
                                   num_examples=tf.function(tf.identity, autograph=False))

  @tf.function(autograph=False)
  def reset_metrics(self):
    for v in self.local_variables:
      v.assign(tf.zeros_like(v))


# ------------------------------------------------------------------- the task


def build(options: TaskOptions) -> base.Task:
  if options.libsvm_path:
    features, raw = parse_libsvm(options.libsvm_path)
    labels, source = binary_labels(raw), options.libsvm_path
  else:
    features, labels = breast_cancer_arrays()
    source = 'sklearn breast_cancer (standardised, + intercept)'
  return build_logistic(features, labels, num_clients=options.num_clients or DEFAULT_CLIENTS,
                        scheme=options.partition, batch_size=options.batch_size,
                        l2_reg=options.l2_reg, seed=options.seed,
                        alpha=options.dirichlet_alpha, source=source)


def build_logistic(features: np.ndarray, labels: np.ndarray, num_clients: int,
                   scheme: str = 'iid', batch_size: int = 1,
                   l2_reg: Optional[float] = None, seed: int = 0, alpha: float = 0.5,
                   source: str = 'arrays') -> base.Task:
  """The logistic task over given arrays (float32 [n, d], labels {0, 1})."""
  l0 = data_smoothness(features)
  lam = l0 / len(labels) if l2_reg is None else float(l2_reg)
  if lam < 0:
    raise base.TaskError(f'l2_reg must be >= 0, got {lam}')
  try:
    parts = partition.split(labels, num_clients, scheme, seed, alpha)
  except ValueError as e:
    raise base.TaskError(str(e)) from None
  data = collections.OrderedDict(x=features.astype(np.float32),
                                 y=labels.astype(np.int32))
  train = partition.to_client_data(data, parts)
  d = features.shape[1]
  test = tf.data.Dataset.from_tensor_slices(data).batch(EVAL_BATCH)
  info = dict(model='logreg', source=source, num_train_clients=num_clients,
              num_train_examples=len(labels), num_features=d, l2_reg=lam,
              data_smoothness=l0, partition=scheme,
              client_sizes=[len(p) for p in parts])
  return base.Task(
      name='logistic', train_data=train, test_data=test,
      preprocess_fn=lambda ds: ds.batch(batch_size),
      model_fn=lambda: LogisticRegression(d, lam), info=info)


# ------------------------------------------------- sampling with replacement


@dataclasses.dataclass(frozen=True)
class WithReplacementTask(base.Task):
  """A task whose client "epoch" is n_i examples drawn WITH replacement.

  The round loop's per-(round, client) shuffle seed (use shuffle='rr') seeds
  the draw, so local SGD with replacement runs through the unchanged loop and
  stays reproducible. Needs `train_data.client_arrays` (`ArrayClientData`).
  """

  @property
  def uses_shuffle_seed(self) -> bool:
    return True  # it seeds the draw

  def client_dataset(self, client_id: str, shuffle_seed: Optional[int] = None,
                     reshuffle_each_epoch: bool = True,
                     augment_seed: Optional[int] = None) -> tf.data.Dataset:
    del reshuffle_each_epoch, augment_seed
    if shuffle_seed is None:
      raise ValueError('sampling with replacement needs a seed (shuffle="rr")')
    arrays = self.train_data.client_arrays(client_id)
    n = len(next(iter(arrays.values())))
    idx = np.random.default_rng(shuffle_seed).integers(n, size=n)
    ds = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict((k, v[idx]) for k, v in arrays.items()))
    return self.preprocess_fn(ds)


def with_replacement(task: base.Task) -> WithReplacementTask:
  fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
  fields['name'] = f'{task.name}_with_replacement'
  return WithReplacementTask(**fields)
