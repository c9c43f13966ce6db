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

import array
import bz2
import collections
import dataclasses
import gzip
import math
import re
import zlib
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

# The loader's memory bound: the dense features (n x d float32) and the d x d
# float64 matrices built from them (the smoothness estimate's A^T A, Newton's
# Hessian in `LogisticProblem`) must each fit in this many bytes. It caps the
# features at 16,384 (8 d^2 <= 2 GiB) and n x d at 2^29 cells: mushrooms
# (8,124 x 112) needs 3.5 MiB.
MAX_DENSE_BYTES = 2 * 1024**3
MAX_FEATURES = math.isqrt(MAX_DENSE_BYTES // 8)
MAX_LINE_BYTES = 64 * 1024**2  # 16,384 features of 30 characters need 0.5 MiB
FLOAT32_MAX = float(np.finfo(np.float32).max)
_INDEX = re.compile(r'([+-]?)0*([0-9]+)')
_FIX_LINE = 'fix or remove the line'
_READ_ERRORS = (OSError, EOFError, zlib.error)  # what a damaged .gz/.bz2 raises


def _open_binary(path: str):
  if path.endswith('.bz2'):
    return bz2.open(path, 'rb')
  if path.endswith('.gz'):
    return gzip.open(path, 'rb')
  return open(path, 'rb')


def _size(nbytes: float) -> str:
  """'1.46 TiB': a byte count in binary units, rounded up to 3 digits."""
  units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB', 'ZiB', 'YiB']
  while nbytes >= 1024 and len(units) > 1:
    nbytes /= 1024
    units.pop(0)
  if units[0] == 'bytes':
    return f'{math.ceil(nbytes):,} bytes'
  scale = 10.0 ** (2 - math.floor(math.log10(nbytes))) if nbytes > 0 else 1.0
  return f'{math.ceil(nbytes * scale - 1e-9) / scale:.3g} {units[0]}'


def _show(token: str) -> str:
  """`token` quoted for a one-line message: escaped, at most 40 characters."""
  return repr(token if len(token) <= 40 else token[:40] + '...')


def _one_line(e: BaseException) -> str:
  return ' '.join(str(e).split()) or type(e).__name__


def _text_lines(path: str, f):
  """(line number, text) of a binary file's lines, refusing a line over
  `MAX_LINE_BYTES` (e.g. /dev/zero), bytes that are not UTF-8 and read errors of
  a damaged .gz/.bz2 file in one line each."""
  lineno = 0
  try:
    while raw := f.readline(MAX_LINE_BYTES + 1):
      lineno += 1
      if len(raw) > MAX_LINE_BYTES:
        raise base.TaskError(f'{path}:{lineno}: the line is longer than '
                             f'{_size(MAX_LINE_BYTES)}, more than a LIBSVM line of '
                             f'{MAX_FEATURES:,} features needs; give a LIBSVM text file')
      try:
        text = raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise base.TaskError(
            f'{path}:{lineno}: byte 0x{raw[e.start]:02x} (byte {e.start + 1} of the line) is '
            f'not UTF-8 text; give a LIBSVM text file (compressed ones must end in .bz2 or '
            f'.gz, which are read as they are)') from None
      yield lineno, text.removeprefix('\ufeff') if lineno == 1 else text
  except _READ_ERRORS as e:
    raise base.TaskError(
        f'{path}: cannot read {f"beyond line {lineno}" if lineno else "it"} '
        f'({_one_line(e)}); the file is damaged, truncated or not what its name says '
        f'(.bz2/.gz are decompressed): get a fresh copy') from None


def _dense_too_big(path: str, n: int, d: int) -> base.TaskError:
  return base.TaskError(
      f'{path}: {n:,} examples x {d:,} features (or more) need {_size(4.0 * n * d)} of '
      f'dense float32 features, over the loader\'s {_size(MAX_DENSE_BYTES)} '
      f'(tasks.libsvm.MAX_DENSE_BYTES); use fewer examples or features')


def _index(key: str, path: str, lineno: int, num_features: int) -> int:
  """A 1-based feature index, refused unless an integer in 1..num_features."""
  match = _INDEX.fullmatch(key)
  if not match:
    raise base.TaskError(f'{path}:{lineno}: feature index {_show(key)} is not an integer; '
                         f'{_FIX_LINE}')
  digits = match.group(2)
  index = int(digits) if len(digits) <= 19 else 10**19  # int() of 4,300+ digits raises
  if match.group(1) == '-' or index < 1:
    raise base.TaskError(f'{path}:{lineno}: feature index {_show(key)} is below 1 (LIBSVM '
                         f'indices start at 1); {_FIX_LINE}')
  if index > num_features:
    if num_features < MAX_FEATURES:
      raise base.TaskError(f'{path}:{lineno}: feature index {_show(key)} > '
                           f'num_features={num_features}; {_FIX_LINE}')
    need = ('more than ' if index == 10**19 else '') + _size(8.0 * index * index)
    raise base.TaskError(
        f'{path}:{lineno}: feature index {_show(key)} is over {MAX_FEATURES:,}: that many '
        f'features need {need} for the d x d smoothness matrix, over the loader\'s '
        f'{_size(MAX_DENSE_BYTES)} (tasks.libsvm.MAX_DENSE_BYTES); {_FIX_LINE}, or '
        f'renumber the features densely')
  return index


def _number(token: str, what: str, path: str, lineno: int, bound: float) -> float:
  """A finite float of magnitude <= `bound`, or a refusal naming the line."""
  try:
    value = float(token)
  except ValueError:
    raise base.TaskError(f'{path}:{lineno}: {what} {_show(token)} is not a number; '
                         f'{_FIX_LINE}') from None
  if not math.isfinite(value):
    raise base.TaskError(f'{path}:{lineno}: {what} {_show(token)} is not a finite number; '
                         f'{_FIX_LINE}')
  if abs(value) > bound:
    raise base.TaskError(f'{path}:{lineno}: {what} {_show(token)} is outside float32\'s '
                         f'range (|v| <= {bound:.3g}), the features\' type; {_FIX_LINE}')
  return value


def _parse_line(tokens: list[str], path: str, lineno: int, num_features: int
                ) -> tuple[float, dict[int, float]]:
  """`label idx:value ...` -> (label, {0-based index: value}). Indices may come
  in any order (the features are dense); one given twice is refused."""
  label = _number(tokens[0], 'label', path, lineno, math.inf)
  features = {}
  for token in tokens[1:]:
    key, colon, value = token.partition(':')
    if not colon:
      raise base.TaskError(f'{path}:{lineno}: {_show(token)} is not an index:value pair; '
                           f'{_FIX_LINE}')
    if key == 'qid':
      continue
    index = _index(key, path, lineno, num_features)
    if index - 1 in features:
      raise base.TaskError(f'{path}:{lineno}: feature index {index} is given twice; keep '
                           f'one of them')
    features[index - 1] = _number(value, 'feature value', path, lineno, FLOAT32_MAX)
  return label, features


def parse_libsvm(path: str, num_features: Optional[int] = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Reads `label idx:value ...` lines (1-based indices) into dense arrays.

  Returns (features float32 [n, d], raw labels float64 [n]); d is the largest
  index seen, or `num_features`. Blank lines and '#' comments are skipped. A
  file that is not UTF-8 text, a line that is not LIBSVM, a value that is not
  finite in float32, or features over `MAX_DENSE_BYTES` is refused with a
  `TaskError` naming the file (and the line), before the dense matrix exists.
  """
  limit = MAX_FEATURES if num_features is None else num_features
  if limit > MAX_FEATURES:
    raise base.TaskError(f'num_features={num_features} is over the loader\'s {MAX_FEATURES:,} '
                         f'(tasks.libsvm.MAX_DENSE_BYTES); ask for fewer')
  try:
    f = _open_binary(path)
  except OSError as e:
    raise base.TaskError(
        f'cannot read LIBSVM file {path!r} ({e.strerror or e}); give --libsvm_path a '
        f'LIBSVM-format file (.bz2/.gz read as they are), e.g. the paper\'s mushrooms from '
        f'{catalog.LIBSVM_SOURCE}, or leave it out for the embedded breast-cancer set') from None
  labels, rows, cols, vals = array.array('d'), array.array('i'), array.array('i'), array.array('f')
  width = 0 if num_features is None else num_features
  with f:
    for lineno, line in _text_lines(path, f):
      for part in line.split('\r'):  # a lone CR ends a line too, as in text mode
        tokens = part.split('#', 1)[0].split()
        if not tokens:
          continue
        label, features = _parse_line(tokens, path, lineno, limit)
        rows.extend([len(labels)] * len(features))
        cols.extend(features.keys())
        vals.extend(features.values())
        labels.append(label)
        width = max(width, max(features, default=-1) + 1)
        if 4 * len(labels) * width > MAX_DENSE_BYTES:
          raise _dense_too_big(path, len(labels), width)
  if not labels:
    raise base.TaskError(f'LIBSVM file {path!r} has no examples (only blank or # lines); '
                         f'give a file with lines "label index:value ..."')
  features = np.zeros((len(labels), width), np.float32)
  features[np.frombuffer(rows, np.int32), np.frombuffer(cols, np.int32)] = np.frombuffer(
      vals, np.float32)
  return features, np.frombuffer(labels, np.float64).copy()


def binary_labels(raw: np.ndarray, source: str = 'the data') -> np.ndarray:
  """Two raw label values (-1/+1, 0/1, 1/2, ...) -> int32 {0, 1}."""
  values = np.unique(raw)
  if len(values) != 2:
    raise base.TaskError(f'{source}: binary classification needs 2 label values, got '
                         f'{len(values)}: {values[:10].tolist()}; give data whose labels '
                         f'take exactly two values (e.g. -1/+1 or 1/2)')
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
  if not np.isfinite(a).all():
    raise base.TaskError('the features hold a value that is not a finite number (nan or inf); '
                         'give finite features')
  if 8.0 * a.shape[1] ** 2 > MAX_DENSE_BYTES:
    raise base.TaskError(f'{a.shape[1]:,} features need {_size(8.0 * a.shape[1] ** 2)} for '
                         f'the d x d smoothness matrix, over {_size(MAX_DENSE_BYTES)} '
                         f'(tasks.libsvm.MAX_DENSE_BYTES); give at most {MAX_FEATURES:,}')
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
    labels, source = binary_labels(raw, options.libsvm_path), options.libsvm_path
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
