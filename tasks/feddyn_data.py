"""The datasets of paper 003 (Acar et al. 2021, FedDyn), split as the paper does.

Centralised datasets are split over `num_clients` clients (default 100) by
`partition.feddyn_split` (paper A.2, its reference code): 'iid' (a random
permutation cut into shards) or 'dirichlet' (per-client class priors
Dir(`dirichlet_alpha`); the paper uses 0.6 and 0.3), with balanced client sizes
or lognormal-unbalanced ones (`unbalanced_sigma`; the paper uses 0.3).

* `feddyn_digits`: scikit-learn's digits (offline; the embedded task's arrays);
* `mnist`, `emnist_letters10` (the first 10 letters of EMNIST 'letters', 48,000 /
  8,000 images), `cifar10`, `cifar100_split`: from tensorflow-datasets, read from
  a prepared TFDS data_dir only (`--cache_dir`, else $TFDS_DATA_DIR, else
  ~/tensorflow_datasets); nothing is downloaded. A missing dataset raises
  `TaskError` naming the directory and the `tfds build` command, before any
  data is read;
* `synthetic_logistic`: paper A.1's convex problem (below), fully offline;
* `shakespeare_003`: the paper's Shakespeare samples (`leaf_shakespeare`: 80
  characters -> the next one, 100 devices x 2,000) from TFF's roles, its
  Embedding 8 + 2 x LSTM(100).

Models: `models.MLP_003` (MNIST 200-200, EMNIST-L 100-100; digits 200-100), `models.cifar_cnn_003`
(CIFAR-10/100), multiclass logistic regression (synthetic).

CIFAR training images are augmented per image as the authors' code does
(`CIFAR_AUGMENT_PAD`); the test sets are not.

Synthetic data (paper A.1, after FedProx's Synthetic(alpha, beta)): client i has
y = argmax(theta_i x + b_i), x in R^30, 5 classes, x ~ N(nu_i, diag(k^-1.2)).
Heterogeneity comes in three types, one at a time (`synthetic_heterogeneity`):
  type1 (optimal models): mu_i ~ N(0, g), every entry of (theta_i, b_i) ~ N(mu_i, 1);
        otherwise one (theta, b) ~ N(0, 1) for all clients;
  type2 (features): beta_i ~ N(0, g), every entry of nu_i ~ N(beta_i, 1); otherwise nu_i = 0;
  type3 (sizes): n_i ~ LogNormal(log(avg), g); otherwise n_i = avg;
'homogeneous' enables none. g = `SYNTHETIC_GAMMA` (1, as FedProx's
Synthetic(1, 1); the paper does not print its values) and, as in both
reference codes, it is the standard deviation. 20 clients, 200 examples on
average. The test set pools a further max(1, n_i // 5) examples per client.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tasks import base
from tasks import catalog
from tasks import cifar10 as cifar10_task
from tasks import embedded
from tasks import image_augment
from tasks import leaf_shakespeare
from tasks import models
from tasks import partition
from tasks.options import TaskOptions

DEFAULT_CLIENTS = catalog.DEFAULT_CLIENTS['paper003']
EVAL_BATCH = 1000
# Channel statistics of the training sets (as the reference code normalises).
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)
# The paper is silent on augmentation; the authors' code (utils_dataset.py,
# `Dataset.__getitem__`, train=True) flips and pad-4-crops each CIFAR training
# image, after normalising it (`image_augment.flip_then_padded_crop`). Always on:
# TaskOptions has no augmentation switch. Evaluation images are not augmented.
CIFAR_AUGMENT_PAD = 4


# ------------------------------------------------------- tensorflow-datasets


def missing_dataset_error(tfds_name: str, data_dir: str, why: str) -> base.TaskError:
  where = os.path.join(data_dir, tfds_name)
  return base.TaskError(
      f'tensorflow-datasets {tfds_name!r} is not prepared under {where} ({why}). '
      f'Prepare it once on a machine with network access: '
      f'`tfds build {tfds_name} --data_dir={data_dir}` (or python -c "import '
      f"tensorflow_datasets as tfds; tfds.load('{tfds_name}', data_dir='{data_dir}')\")"
      f', copy {where} here and pass --cache_dir={data_dir}.')


def check_tfds_prepared(tfds_name: str, cache_dir: Optional[str]) -> str:
  """The TFDS data_dir holding `tfds_name`, or TaskError (cheap: no TFDS import)."""
  data_dir = cifar10_task.tfds_data_dir(cache_dir)
  if not os.path.isdir(os.path.join(data_dir, tfds_name)):
    raise missing_dataset_error(tfds_name, data_dir, 'no such directory')
  return data_dir


def load_tfds_arrays(tfds_name: str, cache_dir: Optional[str]):
  """(x_train, y_train, x_test, y_test) numpy arrays of a prepared TFDS dataset
  (`as_supervised`: image uint8, label int32)."""
  data_dir = check_tfds_prepared(tfds_name, cache_dir)
  try:
    import tensorflow_datasets as tfds
  except Exception as e:  # broken installs raise ImportError or worse
    raise base.TaskError(f'tensorflow-datasets cannot be imported: {e}') from None
  try:
    splits = tfds.load(tfds_name, split=['train', 'test'], data_dir=data_dir,
                       download=False, as_supervised=True)
  except Exception as e:  # TFDS raises AssertionError / DatasetNotFoundError
    raise missing_dataset_error(tfds_name, data_dir, f'{type(e).__name__}: {e}') from None
  # Batches of 10k, not `batch_size=-1` (aborts under TFDS mock_data, TF 2.14).
  (x_tr, y_tr), (x_te, y_te) = [
      tuple(np.concatenate(parts) for parts in zip(*tfds.as_numpy(ds.batch(10_000))))
      for ds in splits]
  return x_tr, y_tr.astype(np.int32), x_te, y_te.astype(np.int32)


# ------------------------------------------------------------ task assembly


def stratified_split(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
  """IID with equal class counts: each class's examples, shuffled, dealt out in
  near-equal shares (paper 003's code for balanced IID CIFAR-100)."""
  labels = np.asarray(labels)
  rng = np.random.default_rng([seed, 5])
  shares = [[] for _ in range(num_clients)]
  for c in np.unique(labels):
    for k, part in enumerate(np.array_split(rng.permutation(np.flatnonzero(labels == c)),
                                            num_clients)):
      shares[k].append(part)
  return [np.sort(np.concatenate(parts)) for parts in shares]


def split_clients(labels: np.ndarray, options: TaskOptions,
                  default_clients: int = DEFAULT_CLIENTS) -> list[np.ndarray]:
  """`partition.feddyn_split` (or `stratified_split`) from the task options
  (errors as TaskError)."""
  catalog.check_paper003_split(options)
  num_clients = options.num_clients or default_clients
  if options.partition == 'stratified':
    return stratified_split(labels, num_clients, options.seed)
  try:
    return partition.feddyn_split(labels, num_clients, options.partition, options.seed,
                                  alpha=options.dirichlet_alpha,
                                  sigma=options.unbalanced_sigma)
  except ValueError as e:
    raise base.TaskError(str(e)) from None


def _task(name, options, x_tr, y_tr, x_te, y_te, transform, keras_fn, element_spec,
          model, source, default_clients=DEFAULT_CLIENTS, augment_pad=None) -> base.Task:
  """`augment_pad`: training images flipped and pad-cropped per image
  (`image_augment.flip_then_padded_crop`) after `transform`; None: none."""
  parts = split_clients(y_tr, options, default_clients)
  sizes = np.array([len(p) for p in parts])
  batches = lambda ds, batch: ds.batch(batch).map(transform)  # noqa: E731
  augment_fn, extra = None, {}
  if augment_pad is not None:
    augment_fn = image_augment.per_image_augmenting_batches(
        lambda ds: batches(ds, options.batch_size), augment_pad)
    extra = dict(train_augmentation=(
        f'per image: flip p=1/2, then p=1/2 a random crop of the {augment_pad}-zero-padded '
        "normalised image (the authors' utils_dataset.py)"))
  return partition.array_task(
      name, ('x', 'y'), (x_tr, y_tr), (x_te, y_te), parts, options.batch_size, EVAL_BATCH,
      batches, model_fn=base.logits_classifier_fn(keras_fn, element_spec),
      augment_fn=augment_fn,
      info=dict(model=model, source=source, num_train_clients=len(parts),
                partition=options.partition, dirichlet_alpha=options.dirichlet_alpha,
                unbalanced_sigma=options.unbalanced_sigma,
                client_size_mean=float(sizes.mean()), client_size_std=float(sizes.std()),
                num_train_examples=int(sizes.sum()), num_test_examples=len(y_te), **extra))


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081   # the reference code's Normalize


def _flat_standardiser(mean: float, std: float):
  """Images flattened, scaled to [0, 1] and standardised (reference code)."""
  def transform(e):
    x = tf.reshape(tf.cast(e['x'], tf.float32) / 255.0, [tf.shape(e['x'])[0], -1])
    return collections.OrderedDict(x=(x - mean) / std, y=e['y'])
  return transform


def _standardiser(mean, std):
  def transform(e):
    x = (tf.cast(e['x'], tf.float32) / 255.0 - tf.constant(mean)) / tf.constant(std)
    return collections.OrderedDict(x=x, y=e['y'])
  return transform


def _flat_spec(dim):
  return collections.OrderedDict(x=tf.TensorSpec([None, dim], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))


IMAGE_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 32, 32, 3], tf.float32),
                                     y=tf.TensorSpec([None], tf.int32))


def build_digits(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = embedded.load_digits_arrays(options.seed)
  model = options.model or 'mlp_200_100'
  keras_fn = (lambda: models.mlp_200_100(64, 10)) if model == 'mlp_200_100' else (
      lambda: tf.keras.Sequential([tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(10)]))
  identity = lambda e: e  # noqa: E731  (digits are already float features in [0, 1])
  return _task('feddyn_digits', options, x_tr, y_tr, x_te, y_te, identity, keras_fn,
               _flat_spec(64), model, 'sklearn digits')


def _mlp_003(options: TaskOptions, default: str):
  """(keras_fn, name) of paper 003's MLP `options.model` (`models.MLP_003`)."""
  name = options.model or default
  return (lambda: models.mlp(models.MLP_003[name], 784, 10)), name


def build_mnist(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = load_tfds_arrays('mnist', options.cache_dir)
  keras_fn, model = _mlp_003(options, 'mlp_200_200')
  return _task('mnist', options, x_tr, y_tr, x_te, y_te,
               _flat_standardiser(MNIST_MEAN, MNIST_STD), keras_fn, _flat_spec(784), model,
               'tfds mnist')


def first_letters(x: np.ndarray, y: np.ndarray, num_letters: int = 10):
  """EMNIST 'letters' labels are 1..26 (a..z): keep 1..num_letters, relabel 0.."""
  keep = (y >= 1) & (y <= num_letters)
  return x[keep], (y[keep] - 1).astype(np.int32)


def build_emnist_letters10(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = load_tfds_arrays('emnist/letters', options.cache_dir)
  x_tr, y_tr = first_letters(x_tr, y_tr)
  x_te, y_te = first_letters(x_te, y_te)
  pixels = x_tr.astype(np.float64) / 255.0   # standardised by the training set (reference)
  transform = _flat_standardiser(float(pixels.mean()), float(pixels.std()) or 1.0)
  keras_fn, model = _mlp_003(options, 'mlp_100_100')
  return _task('emnist_letters10', options, x_tr, y_tr, x_te, y_te, transform, keras_fn,
               _flat_spec(784), model, 'tfds emnist/letters, letters a-j')


def _cnn_003(options: TaskOptions, num_classes: int):
  """(keras_fn, element spec, name) of paper 003's CIFAR CNN `options.model`
  (`models.CNN_003_UNITS`; default the code's 384 units)."""
  name = options.model or 'cnn003'
  units = models.CNN_003_UNITS[name]
  return (lambda: models.cifar_cnn_003(num_classes, units=units)), IMAGE_SPEC, name


def build_cifar10(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = load_tfds_arrays('cifar10', options.cache_dir)
  return _task('cifar10', options, x_tr, y_tr, x_te, y_te,
               _standardiser(cifar10_task.CHANNEL_MEAN, cifar10_task.CHANNEL_STD),
               *_cnn_003(options, 10), 'tfds cifar10',
               augment_pad=CIFAR_AUGMENT_PAD)


def build_cifar100(options: TaskOptions) -> base.Task:
  x_tr, y_tr, x_te, y_te = load_tfds_arrays('cifar100', options.cache_dir)
  return _task('cifar100_split', options, x_tr, y_tr, x_te, y_te,
               _standardiser(CIFAR100_MEAN, CIFAR100_STD),
               *_cnn_003(options, 100), 'tfds cifar100',
               augment_pad=CIFAR_AUGMENT_PAD)


# -------------------------------------------------- synthetic (paper A.1)

HETEROGENEITY = catalog.SYNTHETIC_HETEROGENEITY
SYNTHETIC_GAMMA = 1.0
SYNTHETIC_DIM, SYNTHETIC_CLASSES = 30, 5
SYNTHETIC_CLIENTS, SYNTHETIC_AVG_SIZE = catalog.DEFAULT_CLIENTS['synthetic_logistic'], 200


@dataclasses.dataclass(frozen=True)
class SyntheticData(partition.ClientArrays):
  """Per client [n_i, d] float32 features (`x`), [n_i] int32 labels, and:"""
  theta: np.ndarray  # [N, C, d] optimal model of each client
  bias: np.ndarray   # [N, C]
  nu: np.ndarray     # [N, d] feature means
  sizes: np.ndarray  # [N] training examples per client


def generate_synthetic_logistic(num_clients: int = SYNTHETIC_CLIENTS,
                                avg_size: int = SYNTHETIC_AVG_SIZE,
                                heterogeneity: str = 'homogeneous',
                                gamma: float = SYNTHETIC_GAMMA, seed: int = 0,
                                dim: int = SYNTHETIC_DIM,
                                num_classes: int = SYNTHETIC_CLASSES) -> SyntheticData:
  """Paper 003 A.1's generator (see the module docstring)."""
  if heterogeneity not in HETEROGENEITY:
    raise ValueError(f'unknown heterogeneity {heterogeneity!r}; choose one of '
                     f'{", ".join(HETEROGENEITY)}')
  if num_clients < 1 or avg_size < 1 or gamma < 0:
    raise ValueError('need num_clients >= 1, avg_size >= 1 and gamma >= 0')
  rng = np.random.default_rng([seed, 6])
  n, c, d = num_clients, num_classes, dim
  if heterogeneity == 'type3':
    sizes = np.maximum(1, rng.lognormal(np.log(avg_size), gamma, n).astype(np.int64))
  else:
    sizes = np.full(n, avg_size, np.int64)
  if heterogeneity == 'type1':
    mu = rng.normal(0.0, gamma, n)
    theta = rng.normal(mu[:, None, None], 1.0, (n, c, d))
    bias = rng.normal(mu[:, None], 1.0, (n, c))
  else:
    theta = np.broadcast_to(rng.normal(0.0, 1.0, (c, d)), (n, c, d)).copy()
    bias = np.broadcast_to(rng.normal(0.0, 1.0, c), (n, c)).copy()
  if heterogeneity == 'type2':
    beta = rng.normal(0.0, gamma, n)
    nu = rng.normal(beta[:, None], 1.0, (n, d))
  else:
    nu = np.zeros((n, d))
  std = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # variance k^-1.2
  xs, ys, xt, yt = [], [], [], []
  for i in range(n):
    test = max(1, int(sizes[i]) // 5)
    x = nu[i] + rng.normal(size=(int(sizes[i]) + test, d)) * std
    y = np.argmax(x @ theta[i].T + bias[i], axis=1).astype(np.int32)
    xs.append(x[:sizes[i]].astype(np.float32)); ys.append(y[:sizes[i]])
    xt.append(x[sizes[i]:].astype(np.float32)); yt.append(y[sizes[i]:])
  return SyntheticData(xs, ys, np.concatenate(xt), np.concatenate(yt), theta, bias,
                       nu, sizes)


def build_synthetic(options: TaskOptions) -> base.Task:
  try:
    data = generate_synthetic_logistic(
        num_clients=options.num_clients or SYNTHETIC_CLIENTS,
        heterogeneity=options.synthetic_heterogeneity, seed=options.seed)
  except ValueError as e:
    raise base.TaskError(str(e)) from None
  train = partition.from_client_arrays(data.x, data.y)
  batch = options.batch_size
  d = SYNTHETIC_DIM

  def keras_fn():
    return tf.keras.Sequential([tf.keras.Input(shape=(d,)),
                                tf.keras.layers.Dense(SYNTHETIC_CLASSES)])

  test = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=data.x_test, y=data.y_test)).batch(EVAL_BATCH)
  return base.Task(
      name='synthetic_logistic', train_data=train,
      preprocess_fn=lambda ds: ds.batch(batch), test_data=test,
      model_fn=base.logits_classifier_fn(keras_fn, _flat_spec(d)),
      info=dict(model='logreg', source='generated (paper 003 A.1)',
                heterogeneity=options.synthetic_heterogeneity, gamma=SYNTHETIC_GAMMA,
                num_train_clients=len(data.y), num_train_examples=int(data.sizes.sum()),
                num_test_examples=len(data.y_test)))


# ------------------------------------------------------------- Shakespeare

SYNTHETIC_SHAKESPEARE_CROP = (20, 4)   # samples per device (train, test) on TFF's tiny data


def _role_texts(client_data, client_ids) -> list[np.ndarray]:
  """Each role's snippets joined by spaces, LEAF-encoded."""
  texts = []
  known = set(client_data.client_ids)
  for cid in client_ids:
    snippets = [] if cid not in known else [
        e['snippets'].decode('utf-8', errors='replace')
        for e in client_data.create_tf_dataset_for_client(cid).as_numpy_iterator()]
    texts.append(leaf_shakespeare.encode(' '.join(snippets)))
  return texts


def shakespeare_lstm_003() -> tf.keras.Model:
  """Paper 003's (= FedProx's) model: the 80 characters embedded in 8 dims,
  2 x LSTM(100), logits of the next character from the last step."""
  vocab = len(leaf_shakespeare.LETTERS)
  return tf.keras.Sequential([
      tf.keras.Input(shape=(leaf_shakespeare.WINDOW,), dtype=tf.int32),
      tf.keras.layers.Embedding(vocab, 8),
      tf.keras.layers.LSTM(100, return_sequences=True),
      tf.keras.layers.LSTM(100),
      tf.keras.layers.Dense(vocab),
  ], name='shakespeare_lstm100')


def build_shakespeare(options: TaskOptions) -> base.Task:
  """`leaf_shakespeare`'s samples from TFF's Shakespeare roles, the paper's LSTM."""
  from tasks import tff_data  # pylint: disable=g-import-not-at-top
  catalog.check_shakespeare_003_split(options)
  raw = tff_data.load('shakespeare', options.cache_dir, options.use_synthetic_data)
  ids = list(raw.train.client_ids)
  devices = options.num_clients or catalog.DEFAULT_CLIENTS['shakespeare_003']
  train_texts, test_texts = _role_texts(raw.train, ids), _role_texts(raw.test, ids)
  sizes = {}
  if options.use_synthetic_data:  # TFF's synthetic roles are a few lines long
    sizes = dict(zip(('crop', 'test_crop'), SYNTHETIC_SHAKESPEARE_CROP))
    devices = max(1, min(devices, len(leaf_shakespeare.eligible_roles(
        train_texts, test_texts, **sizes))))
  try:
    samples = leaf_shakespeare.split(train_texts, test_texts, options.partition, devices,
                                     options.seed, **sizes)
  except ValueError as e:
    raise base.TaskError(str(e)) from None
  train = partition.from_client_arrays(samples.x, samples.y)
  batch = options.batch_size

  def to_int(e):
    return collections.OrderedDict(x=tf.cast(e['x'], tf.int32), y=e['y'])

  spec = collections.OrderedDict(
      x=tf.TensorSpec([None, leaf_shakespeare.WINDOW], tf.int32),
      y=tf.TensorSpec([None], tf.int32))
  test = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=samples.x_test, y=samples.y_test)).batch(EVAL_BATCH).map(to_int)
  return base.Task(
      name='shakespeare_003', train_data=train,
      preprocess_fn=lambda ds: ds.batch(batch).map(to_int), test_data=test,
      model_fn=base.logits_classifier_fn(shakespeare_lstm_003, spec),
      info=dict(model='lstm100', source='TFF shakespeare roles, LEAF samples',
                partition=options.partition, num_train_clients=len(samples.y),
                samples_per_client=len(samples.y[0]), roles=samples.roles,
                num_train_examples=sum(len(y) for y in samples.y),
                num_test_examples=len(samples.y_test)))
