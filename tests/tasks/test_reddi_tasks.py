"""Tasks of Reddi et al.'s Table 2 added here: CIFAR-100/CIFAR-10 augmentation, the
EMNIST autoencoder, CIFAR-10 over 500 LDA clients, the per-round example cap.

Offline: data written in TFF's SQLite format or TFDS's mock data; only
`forward_pass` runs (no TFF computation)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import registry
from tasks import tff_data




pytestmark = pytest.mark.usefixtures('offline')  # no test here reaches the network


def _build(name: str, **options) -> base.Task:
  return registry.get_spec(name).builder(registry.TaskOptions(**options))


def _write_sqlite(path, clients):
  """clients: {client_id: (split_name, {feature: array})} in TFF's format."""
  tff.simulation.datasets.save_to_sql_client_data(
      client_ids=list(clients),
      dataset_fn=lambda cid: tf.data.Dataset.from_tensor_slices(clients[cid][1]),
      database_filepath=str(path),
      split_names_by_client_id={cid: split for cid, (split, _) in clients.items()})


def _emnist_examples(n, seed):
  rng = np.random.RandomState(seed)
  return collections.OrderedDict(
      label=rng.randint(0, 62, size=n).astype(np.int32),
      pixels=rng.uniform(size=(n, 28, 28)).astype(np.float32))


def _num_examples(dataset: tf.data.Dataset) -> int:
  return sum(int(tf.shape(tf.nest.flatten(b)[0])[0]) for b in dataset)


# ------------------------------------------------------- CIFAR augmentation


def _windows(image, crop):
  """Every crop x crop window of `image` and of its mirror image, standardised."""
  out = []
  for img in (image, image[:, ::-1]):
    for i in range(image.shape[0] - crop + 1):
      for j in range(image.shape[1] - crop + 1):
        out.append(tf.image.per_image_standardization(
            tf.constant(img[i:i + crop, j:j + crop], tf.float32)).numpy())
  return out


def test_cifar100_training_images_are_randomly_cropped_and_flipped(tmp_path):
  """Random 24x24 crop + flip (TFF's distortion), drawn from the per-(seed, round,
  client) augmentation seed; central crop without it and for evaluation."""
  from tff_algos.training import sampling
  rng = np.random.RandomState(1)
  n = 12
  images = rng.randint(0, 256, size=(n, 32, 32, 3)).astype(np.uint8)
  clients = {'0': ('train', collections.OrderedDict(
      coarse_label=np.zeros(n, np.int64), image=images,
      label=np.arange(n, dtype=np.int64))),
             '9': ('test', collections.OrderedDict(
                 coarse_label=np.zeros(2, np.int64), image=images[:2],
                 label=np.arange(2, dtype=np.int64)))}
  _write_sqlite(tmp_path / 'cifar100.sqlite', clients)
  task = _build('cifar100_image', cache_dir=str(tmp_path), model='resnet18', batch_size=n)

  def batch(**kw):
    x, y = next(iter(task.client_dataset('0', **kw)))
    return x.numpy(), y.numpy()

  central = [tf.image.per_image_standardization(
      tf.constant(img[4:28, 4:28], tf.float32)).numpy() for img in images]
  x_plain, y_plain = batch()
  np.testing.assert_allclose(x_plain, np.stack(central), atol=1e-5)
  x_test, _ = next(iter(task.test_data))
  np.testing.assert_allclose(x_test.numpy(), np.stack(central[:2]), atol=1e-5)

  x_a, y_a = batch(augment_seed=7)
  x_a2, _ = batch(augment_seed=7)
  x_b, _ = batch(augment_seed=8)
  np.testing.assert_array_equal(x_a, x_a2)           # reproducible
  assert not np.allclose(x_a, x_b)                   # a new draw for another seed
  np.testing.assert_array_equal(y_a, y_plain)
  assert x_a.shape == (n, 24, 24, 3)
  flipped = 0
  for k in range(n):
    windows = _windows(images[k], 24)
    hits = [i for i, w in enumerate(windows) if np.allclose(w, x_a[k], atol=1e-5)]
    assert hits, f'example {k} is not a crop of its image'
    flipped += hits[0] >= len(windows) // 2
  assert 0 < flipped < n
  assert sum(not np.allclose(x_a[k], central[k], atol=1e-5) for k in range(n)) >= n // 2

  # The trainer's seed: fresh per round and per client, a function of (seed, round, client).
  seeds = {sampling.augment_seed(0, r, c) for r in range(5) for c in ('0', '1')}
  assert len(seeds) == 10
  assert sampling.augment_seed(3, 2, '0') == sampling.augment_seed(3, 2, '0')


# ------------------------------------------------------- EMNIST autoencoder


def test_emnist_autoencoder_sqlite_end_to_end(tmp_path):
  """TFF's autoencoder data (x = 1 - pixels, target x) and model; the loss is the
  per-example MSE summed over the batch (Reddi et al.'s code), the metric its mean."""
  clients = {'w0': ('all_train', _emnist_examples(5, 0)),
             't0': ('all_test', _emnist_examples(3, 1))}
  _write_sqlite(tmp_path / 'emnist_all.sqlite', clients)
  task = _build('emnist_autoencoder', cache_dir=str(tmp_path), batch_size=4)
  assert task.client_ids == ['w0'] and task.info['model'] == 'tff_ae'
  x, y = next(iter(task.client_dataset('w0')))
  want = 1 - clients['w0'][1]['pixels'][:4].reshape(4, 784)
  np.testing.assert_allclose(x.numpy(), want, atol=1e-6)
  np.testing.assert_array_equal(x.numpy(), y.numpy())
  model = task.model_fn()
  assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 2_837_314
  out = model.forward_pass((x, y), training=False)
  per_example = np.mean((out.predictions.numpy() - want) ** 2, axis=1)
  assert float(out.loss) == pytest.approx(per_example.sum(), rel=1e-4)
  metrics = model.report_local_unfinalized_metrics()
  assert 'mean_squared_error' in metrics
  total, count = (float(v) for v in metrics['mean_squared_error'])
  assert total / count == pytest.approx(per_example.mean(), rel=1e-4)
  assert _num_examples(task.test_data) == 3


def test_client_example_cap_takes_a_fresh_subset_each_round():
  from tasks import get_task
  task = get_task('digits', registry.TaskOptions(batch_size=1000, max_elements_per_user=5))
  assert task.info['max_elements_per_user'] == 5
  cid = task.client_ids[0]
  full = task.train_data.create_tf_dataset_for_client(cid)
  assert sum(1 for _ in full) > 5
  draws = [next(iter(task.client_dataset(cid, shuffle_seed=s)))['x'].numpy()
           for s in range(4)]
  assert all(len(d) == 5 for d in draws)
  rows = {tuple(r) for r in next(iter(full.batch(1000)))['x'].numpy()}
  assert all(tuple(r) in rows for d in draws for r in d)
  assert len({tuple(map(tuple, d)) for d in draws}) > 1  # a new subset per seed
  with pytest.raises(base.TaskError, match='max_elements_per_user'):
    get_task('digits', registry.TaskOptions(max_elements_per_user=0))


# ------------------------------------------------ CIFAR-10 of Reddi et al.


def test_cifar10_lda_split_is_reddis_500_clients_of_100():
  from tasks import cifar10_image
  labels = np.repeat(np.arange(10), 5000).astype(np.int32)
  parts = cifar10_image.lda_split(labels, 500, 0.1, seed=0)
  assert len(parts) == 500 and {len(p) for p in parts} == {100}
  flat = np.concatenate(parts)
  assert len(np.unique(flat)) == 50_000  # every image exactly once
  top_share = [np.bincount(labels[p], minlength=10).max() / 100 for p in parts]
  assert np.median(top_share) > 0.45     # alpha = 0.1: a dominant class (IID: ~0.16)
  again = cifar10_image.lda_split(labels, 500, 0.1, seed=0)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_cifar10_image_missing_data_fails_in_one_line(tmp_path):
  from tasks import get_task
  with pytest.raises(base.TaskError) as err:
    get_task('cifar10_image', registry.TaskOptions(cache_dir=str(tmp_path)))
  message = str(err.value)
  assert '\n' not in message
  assert str(tmp_path / 'cifar10') in message and 'tfds build cifar10' in message


def test_cifar10_image_loads_through_tfds_mock_data(tmp_path):
  import tensorflow_datasets as tfds
  from tasks import get_task
  (tmp_path / 'cifar10').mkdir()
  with tfds.testing.mock_data(num_examples=80):
    task = get_task('cifar10_image', registry.TaskOptions(
        cache_dir=str(tmp_path), batch_size=5, num_clients=4, dirichlet_alpha=0.1))
  assert len(task.client_ids) == 4 and task.info['examples_per_client'] == 20
  x, y = next(iter(task.client_dataset(task.client_ids[0], augment_seed=1)))
  x2, _ = next(iter(task.client_dataset(task.client_ids[0], augment_seed=1)))
  assert x.shape == (5, 24, 24, 3) and x.dtype == tf.float32
  np.testing.assert_array_equal(x.numpy(), x2.numpy())
  model = task.model_fn()
  out = model.forward_pass((x, y), training=False)
  assert out.predictions.shape == (5, 10) and np.isfinite(float(out.loss))
  assert any('group_normalization' in v.name for v in model.trainable_variables)
  xt, _ = next(iter(task.test_data))
  assert xt.shape[1:] == (24, 24, 3)


def test_cifar10_image_resnet18_gn2_has_reddis_two_groups(tmp_path):
  import tensorflow_datasets as tfds
  from tasks import get_task
  (tmp_path / 'cifar10').mkdir()
  with tfds.testing.mock_data(num_examples=40):
    task = get_task('cifar10_image', registry.TaskOptions(
        cache_dir=str(tmp_path), batch_size=5, num_clients=2, model='resnet18_gn2'))
  keras_model = task.model_fn()._keras_model  # pylint: disable=protected-access
  norms = [layer for layer in keras_model.layers
           if isinstance(layer, tf.keras.layers.GroupNormalization)]
  assert task.info['model'] == 'resnet18_gn2' and len(norms) == 20
  assert {layer.groups for layer in norms} == {2}


def test_stackoverflow_tag_code_features_average_over_all_words():
  """Reddi et al.'s bag of words: one-hot over V + 1 (OOV last), the MEAN over all
  words, the OOV column dropped; TFF's divides by the in-vocabulary count."""
  from tasks import stackoverflow
  to_ids = stackoverflow.code_bag_of_words(['a', 'b', 'c'], ['t1', 't2'])
  example = dict(tokens=tf.constant('a b zzz a'), title=tf.constant('c yyy'),
                 tags=tf.constant('t2|t9'))
  words, tags = to_ids(example)
  np.testing.assert_allclose(words.numpy(), [2 / 6, 1 / 6, 1 / 6])  # sums to 4/6 in vocab
  np.testing.assert_array_equal(tags.numpy(), [0.0, 1.0])
  task = _build('stackoverflow_tag', use_synthetic_data=True, batch_size=3,
                model='logreg_code')
  baseline = _build('stackoverflow_tag', use_synthetic_data=True, batch_size=3)
  client = task.client_ids[0]
  (x, y), (x_tff, y_tff) = (next(iter(t.client_dataset(client))) for t in (task, baseline))
  np.testing.assert_array_equal(y.numpy(), y_tff.numpy())
  sums, sums_tff = x.numpy().sum(axis=1), x_tff.numpy().sum(axis=1)
  np.testing.assert_allclose(sums_tff, 1.0, rtol=1e-5)   # TFF: in-vocabulary words only
  assert np.all(sums <= 1 + 1e-6) and np.all(sums > 0)
  # The same direction, scaled by each example's in-vocabulary fraction.
  np.testing.assert_allclose(x.numpy(), x_tff.numpy() * sums[:, None], rtol=1e-5, atol=1e-7)
  model = task.model_fn()
  assert np.isfinite(float(model.forward_pass((x, y), training=False).loss))
