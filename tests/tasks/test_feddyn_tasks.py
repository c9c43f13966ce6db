"""Paper 003 data (splits, synthetic generator, TFDS tasks), models and the
models-transmitted-to-target metric."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tasks import TaskError, TaskOptions, feddyn_data, get_task, models, partition
from tasks import catalog, leaf_shakespeare
from tff_algos import training
from tff_algos.training import targets as metrics_tables


# ------------------------------------------------------------------ splits


@pytest.mark.parametrize('name', ['digits', 'quadratic', 'logistic', 'feddyn_digits',
                                  'synthetic_logistic'])
def test_the_catalogs_client_count_is_the_built_tasks(name):
  """`TaskSpec.num_clients` answers --clients_per_round before the data loads;
  the built task (offline data) has that many clients, with and without
  --num_clients."""
  spec = catalog.TASKS[[s.name for s in catalog.TASKS].index(name)]
  for options in (TaskOptions(), TaskOptions(num_clients=7)):
    assert len(get_task(name, options).client_ids) == spec.num_clients(options), options
  assert spec.num_clients(TaskOptions(use_synthetic_data=True)) is None


def test_lognormal_client_sizes_balanced_and_unbalanced():
  assert partition.lognormal_client_sizes(60_000, 100, 0.0, seed=0).tolist() == [600] * 100
  assert partition.lognormal_client_sizes(1438, 100, 0.0, seed=0).tolist() == [14] * 100
  sizes = partition.lognormal_client_sizes(2_000_000, 4000, 0.3, seed=1)
  assert sizes.sum() == 2_000_000 and sizes.min() >= 1
  # The paper's "standard deviation 0.3": the log-sizes have std sigma.
  assert np.std(np.log(sizes[1:])) == pytest.approx(0.3, abs=0.015)
  assert np.array_equal(sizes, partition.lognormal_client_sizes(2_000_000, 4000, 0.3, seed=1))
  with pytest.raises(ValueError):
    partition.lognormal_client_sizes(100, 10, -0.1, seed=0)


def test_iid_sized_split_uses_the_sizes_and_no_example_twice():
  sizes = np.array([5, 1, 7, 3])
  parts = partition.iid_sized_split(20, sizes, seed=3)
  assert [len(p) for p in parts] == sizes.tolist()
  union = np.concatenate(parts)
  assert len(np.unique(union)) == 16 and union.max() < 20


def _classes_for_share(labels, parts, share, num_classes=10):
  """For each client: how many of its most frequent classes hold `share` of it."""
  out = []
  for p in parts:
    counts = np.sort(np.bincount(labels[p], minlength=num_classes))[::-1]
    out.append(int(np.searchsorted(np.cumsum(counts) / counts.sum(), share - 1e-9)) + 1)
  return np.array(out)


def test_dirichlet_prior_split_matches_the_paper_heterogeneity():
  """Paper 003 A.2 (MNIST-like: 10 balanced classes, 100 clients): 80% of a
  client's data lies mostly in 4-5 classes at Dir(0.6), 3-4 at Dir(0.3)."""
  labels = np.repeat(np.arange(10), 3000)
  sizes = partition.lognormal_client_sizes(len(labels), 100, 0.0, seed=0)
  modes = {}
  for alpha in (0.6, 0.3):
    parts = partition.dirichlet_prior_split(labels, sizes, alpha, seed=0)
    assert [len(p) for p in parts] == [300] * 100
    union = np.concatenate(parts)
    assert len(union) == len(np.unique(union)) == len(labels)  # each example once
    counts = np.bincount(_classes_for_share(labels, parts, 0.8), minlength=11)
    modes[alpha] = set(np.argsort(counts)[-2:].tolist())  # two most common counts
  assert modes[0.6] == {4, 5}
  assert modes[0.3] == {3, 4}
  # IID clients need 8 classes for 80% of their data.
  iid = partition.iid_sized_split(len(labels), sizes, seed=0)
  assert np.median(_classes_for_share(labels, iid, 0.8)) == 8


def test_dirichlet_prior_split_survives_exhausted_classes_and_is_seeded():
  labels = np.array([0] * 3 + [1] * 200 + [2] * 97)  # class 0 runs out at once
  sizes = partition.lognormal_client_sizes(len(labels), 10, 0.3, seed=2)
  a = partition.dirichlet_prior_split(labels, sizes, 0.05, seed=4)
  b = partition.dirichlet_prior_split(labels, sizes, 0.05, seed=4)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert sorted(np.concatenate(a).tolist()) == list(range(len(labels)))
  assert [len(p) for p in a] == sizes.tolist()


def test_stratified_split_gives_every_client_equal_class_counts():
  labels = np.repeat(np.arange(10), 20)
  parts = feddyn_data.stratified_split(labels, 4, seed=1)
  assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(200))   # each once
  for part in parts:
    assert np.bincount(labels[part], minlength=10).tolist() == [5] * 10
  assert not np.array_equal(parts[0], feddyn_data.stratified_split(labels, 4, seed=2)[0])
  with pytest.raises(TaskError, match='unbalanced_sigma'):
    catalog.check_paper003_split(TaskOptions(partition='stratified', unbalanced_sigma=0.3))


def test_feddyn_split_rejects_other_schemes():
  with pytest.raises(ValueError, match='paper-003'):
    partition.feddyn_split(np.zeros(10, int), 2, 'sorted', seed=0)
  with pytest.raises(TaskError, match='paper-003 tasks split'):
    get_task('feddyn_digits', TaskOptions(partition='sorted'))


def test_feddyn_digits_task_is_unbalanced_and_label_skewed():
  task = get_task('feddyn_digits', TaskOptions(partition='dirichlet', dirichlet_alpha=0.3,
                                               unbalanced_sigma=0.3, num_clients=20))
  sizes = [len(task.train_data.client_arrays(c)['y']) for c in task.client_ids]
  assert sum(sizes) == task.info['num_train_examples'] == 1797 - 359
  assert np.std(sizes) > 0
  top = [np.bincount(task.train_data.client_arrays(c)['y']).max() / n
         for c, n in zip(task.client_ids, sizes)]
  assert np.mean(top) > 0.4  # IID clients of ~72 digits: ~0.17
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  model = task.model_fn()
  out = model.forward_pass(batch, training=False)
  assert out.predictions.shape[-1] == 10 and np.isfinite(float(out.loss))


# --------------------------------------------------------------- synthetic


def _log_std(x):
  return float(np.std(np.log(x)))


def test_synthetic_generator_homogeneous():
  d = feddyn_data.generate_synthetic_logistic(num_clients=200, avg_size=100, seed=0)
  assert d.sizes.tolist() == [100] * 200
  assert np.all(d.theta == d.theta[0]) and np.all(d.bias == d.bias[0]) and np.all(d.nu == 0)
  x = np.concatenate(d.x)
  var = np.arange(1, 31) ** -1.2
  np.testing.assert_allclose(x.var(axis=0), var, rtol=0.06)
  np.testing.assert_allclose(x.mean(axis=0), 0, atol=4 * np.sqrt(var / len(x)).max())
  # Labels are the argmax of the one optimal model, train and test alike.
  y = np.argmax(x @ d.theta[0].T + d.bias[0], axis=1)
  assert np.array_equal(y, np.concatenate(d.y))
  assert np.array_equal(np.argmax(d.x_test @ d.theta[0].T + d.bias[0], axis=1), d.y_test)
  assert len(d.y_test) == 200 * 20
  assert len(np.unique(y)) == 5


def test_synthetic_generator_heterogeneity_types():
  n = 400
  t1 = feddyn_data.generate_synthetic_logistic(num_clients=n, avg_size=20,
                                               heterogeneity='type1', seed=1)
  # mu_i ~ N(0, 1), entries ~ N(mu_i, 1): the per-client entry mean has std
  # sqrt(1 + 1/155) across clients; the within-client spread is 1.
  means = np.concatenate([t1.theta.reshape(n, -1), t1.bias], axis=1).mean(axis=1)
  assert np.std(means) == pytest.approx(1.0, abs=0.1)
  assert np.std(t1.theta - t1.theta.mean(axis=(1, 2), keepdims=True)) == pytest.approx(1, abs=0.03)
  assert np.all(t1.nu == 0) and np.all(t1.sizes == 20)

  t2 = feddyn_data.generate_synthetic_logistic(num_clients=n, avg_size=20,
                                               heterogeneity='type2', seed=2)
  assert np.all(t2.theta == t2.theta[0]) and np.all(t2.sizes == 20)
  assert np.std(t2.nu.mean(axis=1)) == pytest.approx(1.0, abs=0.1)
  # Each client's features centre on its own nu_i.
  resid = np.concatenate([x - nu for x, nu in zip(t2.x, t2.nu)])
  assert np.abs(resid.mean(axis=0)).max() < 0.05

  t3 = feddyn_data.generate_synthetic_logistic(num_clients=n, avg_size=200,
                                               heterogeneity='type3', seed=3)
  assert np.all(t3.theta == t3.theta[0]) and np.all(t3.nu == 0)
  assert _log_std(t3.sizes) == pytest.approx(1.0, abs=0.1)
  assert np.median(t3.sizes) == pytest.approx(200, rel=0.15)
  assert [len(y) for y in t3.y] == t3.sizes.tolist()
  with pytest.raises(ValueError, match='heterogeneity'):
    feddyn_data.generate_synthetic_logistic(heterogeneity='type4')


def test_synthetic_logistic_task():
  task = get_task('synthetic_logistic', TaskOptions(synthetic_heterogeneity='type3',
                                                    batch_size=10))
  assert len(task.client_ids) == 20
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  assert batch['x'].shape[1:] == (30,) and batch['x'].dtype == tf.float32
  model = task.model_fn()
  out = model.forward_pass(batch, training=False)
  assert out.predictions.shape[-1] == 5
  with pytest.raises(TaskError, match='heterogeneity'):
    get_task('synthetic_logistic', TaskOptions(synthetic_heterogeneity='type9'))


# ------------------------------------------------------ tensorflow-datasets

TFDS_TASKS = {'mnist': ('mnist', (784,), 10), 'emnist_letters10': ('emnist/letters', (784,), 10),
              'cifar10': ('cifar10', (32, 32, 3), 10),
              'cifar100_split': ('cifar100', (32, 32, 3), 100)}


@pytest.mark.parametrize('task_name', sorted(TFDS_TASKS))
def test_missing_tfds_dataset_fails_first_naming_dir_and_command(task_name, tmp_path,
                                                                 monkeypatch):
  import tensorflow_datasets as tfds

  def no_load(*a, **k):
    raise AssertionError('tfds.load must not be reached')

  monkeypatch.setattr(tfds, 'load', no_load)
  tfds_name = TFDS_TASKS[task_name][0]
  with pytest.raises(TaskError) as err:
    get_task(task_name, TaskOptions(cache_dir=str(tmp_path)))
  message = str(err.value)
  assert str(tmp_path / tfds_name) in message
  assert f'tfds build {tfds_name} --data_dir={tmp_path}' in message


def test_first_letters_keeps_a_to_j():
  y = np.arange(0, 27)
  x, y10 = feddyn_data.first_letters(y[:, None], y)
  assert x[:, 0].tolist() == list(range(1, 11)) and y10.tolist() == list(range(10))


@pytest.mark.parametrize('task_name', sorted(TFDS_TASKS))
def test_tfds_tasks_load_through_mock_data(task_name, tmp_path):
  import tensorflow_datasets as tfds
  tfds_name, shape, classes = TFDS_TASKS[task_name]
  (tmp_path / tfds_name).mkdir(parents=True)
  with tfds.testing.mock_data(num_examples=80):
    task = get_task(task_name, TaskOptions(cache_dir=str(tmp_path), batch_size=4,
                                           num_clients=4, partition='dirichlet',
                                           dirichlet_alpha=0.3))
  assert len(task.client_ids) == 4
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  assert tuple(batch['x'].shape[1:]) == shape and batch['x'].dtype == tf.float32
  ys = np.concatenate([task.train_data.client_arrays(c)['y'] for c in task.client_ids])
  assert ys.min() >= 0 and ys.max() < classes
  model = task.model_fn()
  out = model.forward_pass(batch, training=False)
  assert out.predictions.shape[-1] == classes and np.isfinite(float(out.loss))
  if task_name == 'emnist_letters10':  # mock labels 0..36: only 1..10 are kept
    assert task.info['num_train_examples'] < 80
  # Paper 003's MLPs by default (App. A.2, the authors' utils_models.py).
  default = {'mnist': 'mlp_200_200', 'emnist_letters10': 'mlp_100_100'}.get(task_name)
  if default:
    hidden = [v.shape[-1] for v in model.trainable_variables if len(v.shape) == 1][:-1]
    assert task.info['model'] == default and hidden == list(models.MLP_003[default])


def test_mnist_and_emnist_letters_are_standardised_as_the_reference_code(monkeypatch):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (400, 28, 28, 1)).astype(np.uint8)
  x[:, :8] = 0                                  # a skewed pixel distribution
  y = rng.integers(1, 11, 400).astype(np.int32)
  monkeypatch.setattr(feddyn_data, 'load_tfds_arrays', lambda *a: (x, y, x[:50], y[:50]))

  def train_pixels(name):
    task = get_task(name, TaskOptions(batch_size=50, num_clients=4))
    return np.concatenate([b['x'].numpy() for c in task.client_ids
                           for b in task.client_dataset(c)])
  mnist = train_pixels('mnist')
  np.testing.assert_allclose(mnist.mean(), (x.mean() / 255 - 0.1307) / 0.3081, rtol=1e-4)
  emnist = train_pixels('emnist_letters10')      # by its own training set's mean/std
  assert abs(emnist.mean()) < 1e-3 and abs(emnist.std() - 1) < 1e-3


# ------------------------------------------- CIFAR augmentation (authors' code)

CIFAR_STATS = {'cifar10': (feddyn_data.cifar10_task.CHANNEL_MEAN,
                           feddyn_data.cifar10_task.CHANNEL_STD),
               'cifar100_split': (feddyn_data.CIFAR100_MEAN, feddyn_data.CIFAR100_STD)}


def _cifar_task(name, monkeypatch, n=400, batch_size=50):
  rng = np.random.default_rng(1)
  x = rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8)
  y = rng.integers(0, 10, n).astype(np.int32)
  x_te = rng.integers(0, 256, (60, 32, 32, 3)).astype(np.uint8)
  monkeypatch.setattr(feddyn_data, 'load_tfds_arrays', lambda *a: (x, y, x_te, y[:60]))
  return get_task(name, TaskOptions(batch_size=batch_size, num_clients=4)), x_te


def _images(dataset):
  return [b['x'].numpy() for b in dataset]


def _augmentation_of(plain, augmented, pad=4):
  """(flipped, row offset, column offset) with which `augmented` is `plain`
  flipped left-right (or not), zero-padded by `pad` and cropped; None if none."""
  found = []
  for flipped in (False, True):
    padded = np.pad(plain[:, ::-1] if flipped else plain, [(pad, pad), (pad, pad), (0, 0)])
    for dy in range(2 * pad + 1):
      for dx in range(2 * pad + 1):
        if np.array_equal(padded[dy:dy + 32, dx:dx + 32], augmented):
          found.append((flipped, dy, dx))
  assert len(found) <= 1
  return found[0] if found else None


@pytest.mark.parametrize('name', sorted(CIFAR_STATS))
def test_paper003_cifar_training_images_are_flipped_and_pad_cropped_per_image(
    name, monkeypatch):
  """The authors' utils_dataset.py (`Dataset.__getitem__`, train=True): each
  normalised training image flipped with probability 1/2, then with probability
  1/2 a random 32x32 window of it zero-padded by 4."""
  task, _ = _cifar_task(name, monkeypatch)
  cid = task.client_ids[0]
  plain = np.concatenate(_images(task.client_dataset(cid)))  # no seed: not augmented
  assert 'per image' in task.info['train_augmentation']
  spec = task.client_dataset(cid, augment_seed=0).element_spec
  assert spec == task.client_dataset(cid).element_spec == feddyn_data.IMAGE_SPEC
  draws, images = [], []
  for seed in range(10):
    batches = _images(task.client_dataset(cid, augment_seed=seed))
    assert [len(b) for b in batches] == [50, 50]
    images.extend(np.concatenate(batches))
    found = [_augmentation_of(p, a) for p, a in zip(plain, np.concatenate(batches))]
    assert None not in found   # every image: a flipped and/or shifted copy, zero border
    assert len(set(found[:50])) > 20   # images of one batch drew their own
    draws += found
  flipped = np.mean([f for f, _, _ in draws])
  cropped = np.mean([(dy, dx) != (4, 4) for _, dy, dx in draws])
  assert abs(flipped - 0.5) < 0.06                          # 1000 draws, std 0.016
  assert abs(cropped - 0.5 * 80 / 81) < 0.06                # offset (4, 4) is no shift
  shifts = [(dy, dx) for _, dy, dx in draws if (dy, dx) != (4, 4)]
  assert {dy for dy, _ in shifts} == {dx for _, dx in shifts} == set(range(9))
  # A shifted image has a zero border (zero in normalised space: the channel mean).
  for (_, dy, dx), image in zip(draws, images):
    rows = slice(max(0, 4 - dy), 32 - max(0, dy - 4))
    cols = slice(max(0, 4 - dx), 32 - max(0, dx - 4))
    assert np.all(image[rows, cols] != 0)
    assert np.count_nonzero(image) == image[rows, cols].size


@pytest.mark.parametrize('name', sorted(CIFAR_STATS))
def test_paper003_cifar_evaluation_is_not_augmented(name, monkeypatch):
  task, x_te = _cifar_task(name, monkeypatch)
  mean, std = CIFAR_STATS[name]
  test = np.concatenate(_images(task.test_data))
  np.testing.assert_allclose(test, (x_te / 255.0 - np.array(mean)) / np.array(std),
                             rtol=1e-5, atol=1e-5)
  assert np.array_equal(test, np.concatenate(_images(task.test_data)))


def test_paper003_cifar_augmentation_is_deterministic_for_a_seed(monkeypatch):
  task, _ = _cifar_task('cifar10', monkeypatch)
  cid = task.client_ids[1]

  def images(shuffle_seed, augment_seed):  # as the trainer asks, two epochs
    ds = task.client_dataset(cid, shuffle_seed, augment_seed=augment_seed).repeat(2)
    return np.concatenate(_images(ds))
  a = images(3, 7)
  assert np.array_equal(a, images(3, 7))           # a rerun (or resume) draws the same
  assert not np.array_equal(a, images(3, 8))       # another round/client: fresh draws
  assert not np.array_equal(a[:100], a[100:])      # the epoch is reshuffled


# ------------------------------------------------------------------ models


def test_paper003_model_sizes():
  assert models.mlp_200_100().count_params() == 784 * 200 + 200 + 200 * 100 + 100 + 1010
  # App. A.2 and the authors' utils_models.py: MNIST 784-200-200-10, EMNIST-L 784-100-100-10.
  mlp = lambda name: models.mlp(models.MLP_003[name], 784, 10)
  assert mlp('mlp_200_200').count_params() == 199_210
  assert mlp('mlp_100_100').count_params() == 89_610
  assert [layer.units for layer in mlp('mlp_100_100').layers] == [100, 100, 10]
  assert models.cifar_cnn_003(10).count_params() == 797_962
  assert models.cifar_cnn_003(100).count_params() == 797_962 + 192 * 90 + 90
  # The text's 394 units (App. A.2) against the code's 384: 10 more in the first FC layer.
  text = models.cifar_cnn_003(10, units=models.CNN_003_UNITS['cnn003_text'])
  assert text.count_params() == 797_962 + 10 * (1600 + 1) + 10 * 192
  lstm = models.shakespeare_lstm_003(80, return_sequences=False)
  # embedding 80x8, LSTM(8->100), LSTM(100->100), dense 100->80
  assert lstm.count_params() == 640 + 4 * (100 * 108 + 100) + 4 * (100 * 200 + 100) + 8080
  x = tf.ones([2, 5], tf.int64)
  assert lstm(x).shape == (2, 80)
  assert models.shakespeare_lstm_003(90)(x).shape == (2, 5, 90)


# ------------------------------------------------------------------ metric


def _rows(n_rounds, per_client_bytes, m, acc_every=1, accs=None):
  rows = []
  for r in range(1, n_rounds + 1):
    row = {'round': float(r), 'download_bytes': float(m * per_client_bytes)}
    if r % acc_every == 0:
      row['eval/sparse_categorical_accuracy'] = accs[r - 1]
      row['eval/loss'] = 1.0 - accs[r - 1]
    rows.append(row)
  return rows


def test_models_to_target_counts_models_per_client_round():
  accs = [0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.9]
  model = 1000
  fedavg = metrics_tables.models_to_target(_rows(8, model, 10, accs=accs), 0.7, model, 10)
  assert fedavg.reached and fedavg.round == 4 and fedavg.models_transmitted == 4.0
  assert fedavg.total_models == 40.0 and fedavg.cell() == '4'
  # SCAFFOLD downloads the model and the control variate: two per round.
  scaffold = metrics_tables.models_to_target(_rows(8, 2 * model, 10, accs=accs), 0.7, model, 10)
  assert scaffold.round == 4 and scaffold.models_transmitted == 8.0
  # Extra broadcast scalars are counted, not rounded away.
  extra = metrics_tables.models_to_target(_rows(8, model + 8, 3, accs=accs), 0.7, model, 3)
  assert extra.models_transmitted == pytest.approx(4 * 1.008)
  # Not reached: a lower bound over every round run, marked '+'.
  never = metrics_tables.models_to_target(_rows(8, model, 10, accs=accs), 0.95, model, 10)
  assert not never.reached and never.round is None and never.models_transmitted == 8.0
  assert never.cell() == '8+' and never.final_value == 0.9
  # Sparse evaluations (every 3 rounds), unsorted rows, loss targets (from above).
  rows = _rows(8, model, 10, acc_every=3, accs=accs)[::-1]
  sparse = metrics_tables.models_to_target(rows, 0.6, model, 10)  # evals: .5, .85
  assert sparse.round == 6 and sparse.models_transmitted == 6.0
  loss = metrics_tables.models_to_target(rows, 0.3, model, 10, metric='eval/loss')
  assert loss.round == 6 and loss.final_value == pytest.approx(0.15)
  with pytest.raises(ValueError, match='download_bytes'):
    metrics_tables.models_to_target([{'round': 1.0}], 0.5, model, 10)


def test_models_to_target_reads_a_run_directory(tmp_path):
  accs = [0.2, 0.6, 0.65]
  csv = training.MetricsCSV(str(tmp_path / 'metrics.csv'), resume_round=0)
  for row in _rows(3, 2 * 500, 4, accs=accs):
    csv.append(row)
  (tmp_path / 'summary.json').write_text(json.dumps(
      {'model_bytes': 500, 'clients_per_round': 4, 'download_bytes_per_client': 1000}))
  res = metrics_tables.run_models_to_target(str(tmp_path), 0.6)
  assert res.round == 2 and res.models_transmitted == 4.0 and res.total_models == 16.0


def test_shakespeare_003_uses_the_papers_lstm_on_one_next_character():
  task = get_task('shakespeare_003', TaskOptions(use_synthetic_data=True, batch_size=2,
                                                 partition='natural'))
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  assert tuple(batch['x'].shape) == (2, 80) and tuple(batch['y'].shape) == (2,)
  model = task.model_fn()
  out = model.forward_pass(batch, training=False)
  assert tuple(out.predictions.shape) == (2, 80) and np.isfinite(float(out.loss))
  shapes = sorted(tuple(v.shape) for v in model.trainable_variables)
  assert (80, 8) in shapes                                   # embedding, 80 letters
  assert (8, 400) in shapes and shapes.count((100, 400)) == 3  # 2 x LSTM(100)
  assert (100, 80) in shapes                                 # logits of 80 letters
  assert task.info['model'] == 'lstm100'


def test_leaf_samples_are_80_character_windows_and_the_next_character():
  codes = leaf_shakespeare.encode('To be,\n  or not   to be')
  assert ''.join(leaf_shakespeare.LETTERS[c] for c in codes) == 'To be, or not to be'
  text = leaf_shakespeare.encode(''.join(chr(65 + i % 26) for i in range(100)))
  x, y = leaf_shakespeare.windows(text, np.array([0, 7]))
  assert x.shape == (2, 80) and leaf_shakespeare.num_samples(text) == 20
  np.testing.assert_array_equal(x[1], text[7:87])
  np.testing.assert_array_equal(y, [text[80], text[87]])
  assert len(leaf_shakespeare.LETTERS) == 80


def _roles(lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, 80, n).astype(np.uint8) for n in lengths]


def test_natural_split_crops_consecutive_samples_of_eligible_roles():
  # Paper 003 / its code: roles with > 2000 train and > 400 test samples, 100
  # of them, 2000 consecutive training and 400 consecutive test samples each.
  train = _roles([2100, 5000, 1500, 3000] * 30)
  test = _roles([600, 900, 900, 300] * 30, seed=1)
  samples = leaf_shakespeare.natural_split(train, test, 30, seed=0)
  assert len(samples.x) == 30 and samples.x_test.shape == (30 * 400, 80)
  for i, role in enumerate(samples.roles):
    assert role % 4 in (0, 1)          # the 1500-sample and 300-test roles are left out
    x, y = samples.x[i], samples.y[i]
    assert x.shape == (2000, 80) and y.shape == (2000,)
    every, labels = leaf_shakespeare.windows(
        train[role], np.arange(leaf_shakespeare.num_samples(train[role])))
    start = int(np.flatnonzero(np.all(every == x[0], axis=1))[0])
    np.testing.assert_array_equal(x, every[start:start + 2000])   # consecutive
    np.testing.assert_array_equal(y, labels[start:start + 2000])
  assert len(set(samples.roles)) == 30
  with pytest.raises(ValueError, match='only 60 roles'):
    leaf_shakespeare.natural_split(train, test, 61, seed=0)


def test_iid_split_deals_out_samples_of_all_roles():
  train = _roles([3000, 4000, 5000])
  test = _roles([700, 800, 900], seed=1)
  samples = leaf_shakespeare.iid_split(train, test, 4, seed=2, crop=500, test_crop=100)
  assert [x.shape for x in samples.x] == [(500, 80)] * 4
  assert samples.x_test.shape == (400, 80) and samples.roles is None
  every = np.concatenate([leaf_shakespeare.windows(t, np.arange(len(t) - 80))[0]
                          for t in train])
  drawn = np.concatenate(samples.x)
  keys = {bytes(r) for r in every}
  assert all(bytes(r) in keys for r in drawn[::50])        # real windows ...
  assert len({bytes(r) for r in drawn}) == len(drawn)      # ... without replacement
  first = np.array([bytes(r) in {bytes(w) for w in leaf_shakespeare.windows(
      train[0], np.arange(2920))[0]} for r in samples.x[0]])
  assert 0.1 < first.mean() < 0.5                          # mixed over roles (~25 %)
