"""Client splits of centralised data, and the embedded digits task."""

import os
import subprocess
import sys

import numpy as np
import pytest

from paths import ROOT
from tasks import TaskOptions, TaskError, get_task, list_tasks
from tasks import partition


def test_dirichlet_split_covers_every_example_once_and_is_seeded():
  labels = np.repeat(np.arange(10), 100)
  parts = partition.dirichlet_label_split(labels, 20, alpha=0.3, seed=1)
  allidx = np.concatenate(parts)
  assert sorted(allidx.tolist()) == list(range(1000))
  assert min(len(p) for p in parts) >= 1
  again = partition.dirichlet_label_split(labels, 20, alpha=0.3, seed=1)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_small_alpha_skews_labels_more_than_large_alpha():
  labels = np.repeat(np.arange(10), 200)

  def mean_classes(alpha):
    parts = partition.dirichlet_label_split(labels, 20, alpha=alpha, seed=0)
    return np.mean([len(np.unique(labels[p])) for p in parts])

  assert mean_classes(0.1) < 5 < mean_classes(100.0)


def test_iid_split():
  parts = partition.iid_split(103, 10, seed=0)
  assert sorted(np.concatenate(parts).tolist()) == list(range(103))
  assert {len(p) for p in parts} <= {10, 11}


def test_array_client_data_views_the_right_rows():
  feats = {'x': np.arange(10, dtype=np.float32)[:, None], 'y': np.arange(10, dtype=np.int32)}
  cd = partition.to_client_data(feats, [np.array([3, 1]), np.array([0, 9, 5])])
  assert cd.client_ids == ['client_0', 'client_1']
  got = [int(e['y']) for e in cd.create_tf_dataset_for_client('client_1')]
  assert got == [0, 9, 5]
  serial = [int(e['y']) for e in cd.serializable_dataset_fn('client_0')]
  assert serial == [3, 1]
  with pytest.raises(ValueError):
    cd.create_tf_dataset_for_client('client_7')


def test_client_datasets_equal_from_tensor_slices():
  """`create_tf_dataset_for_client` builds the TensorSliceDataset op itself (a
  third of `from_tensor_slices`' cost); it must give the same dataset: element
  spec (dict order included), elements and their dtypes, cardinality, for
  clients of one, several and no rows."""
  import tensorflow as tf
  rng = np.random.default_rng(1)
  features = {'y': rng.integers(0, 9, 12).astype(np.int32),
              'x': rng.random((12, 3, 2)).astype(np.float32),
              'w': rng.random(12)}  # float64
  data = partition.to_client_data(features, [np.array([4]), np.arange(5, 12),
                                             np.zeros([0], np.int64), np.arange(4)])
  for cid in data.client_ids:
    got = data.create_tf_dataset_for_client(cid)
    want = tf.data.Dataset.from_tensor_slices(data.client_arrays(cid))
    assert got.element_spec == want.element_spec
    assert list(got.element_spec) == ['y', 'x', 'w']
    assert int(got.cardinality()) == int(want.cardinality()) == len(data.client_arrays(cid)['y'])
    got_rows, want_rows = list(got.batch(3).as_numpy_iterator()), list(
        want.batch(3).as_numpy_iterator())
    assert len(got_rows) == len(want_rows)
    for a, b in zip(got_rows, want_rows):
      for name in features:
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name])


def test_digits_task_is_real_offline_data():
  task = get_task('digits', TaskOptions(batch_size=10, num_clients=25, seed=3))
  assert len(task.client_ids) == 25
  sizes = [len(task.train_data.client_arrays(c)['y']) for c in task.client_ids]
  assert sum(sizes) == task.info['num_train_examples'] == 1797 - 1797 // 5
  batch = next(iter(task.client_dataset(task.client_ids[0], shuffle_seed=1)))
  assert batch['x'].shape[1] == 64 and float(batch['x'].numpy().max()) <= 1.0
  n_test = sum(int(b['y'].shape[0]) for b in task.test_data)
  assert n_test == 1797 // 5


def test_registry_lists_every_task_and_rejects_bad_requests():
  assert {'digits', 'quadratic', 'emnist_character', 'shakespeare_character',
          'stackoverflow_tag', 'stackoverflow_word', 'cifar100_image'} <= set(list_tasks())
  with pytest.raises(TaskError, match='unknown task'):
    get_task('no_such_task')
  with pytest.raises(TaskError, match='no model'):
    get_task('digits', TaskOptions(model='resnet18'))


def test_every_declared_task_has_its_builder():
  for spec in list_tasks().values():
    assert callable(spec.builder), spec.builder_path


_CHECK_WITHOUT_TENSORFLOW = """
import sys
import tasks
bad = [('digits', dict(model='nosuchmodel'), 'no model'),
       ('no_such_task', {}, 'unknown task'),
       ('logistic', dict(partition='natural'), 'unknown partition'),
       ('cifar10_lenet', dict(partition='stratified'), 'unknown partition'),
       ('feddyn_digits', dict(partition='sorted'), 'paper-003 tasks split'),
       ('mnist', dict(partition='stratified', unbalanced_sigma=0.3), 'unbalanced_sigma'),
       ('shakespeare_003', dict(partition='dirichlet'), 'shakespeare_003 splits'),
       ('synthetic_logistic', dict(synthetic_heterogeneity='type9'), 'heterogeneity')]
for name, options, message in bad:
  try:
    tasks.check_options(name, tasks.TaskOptions(**options))
    raise SystemExit(f'{name} {options}: accepted')
  except tasks.TaskError as e:
    assert message in str(e), (name, str(e))
tasks.check_options('feddyn_digits', tasks.TaskOptions(partition='stratified'))
assert tasks.list_tasks()['digits'].models == ('mlp', 'logistic')
print('tensorflow' in sys.modules)
"""


def test_task_requests_are_checked_without_loading_tensorflow():
  done = subprocess.run([sys.executable, '-c', _CHECK_WITHOUT_TENSORFLOW],
                        capture_output=True, text=True, timeout=60, check=False,
                        cwd=ROOT)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == 'False'


def test_cifar10_task_loads_through_tensorflow_datasets(tmp_path):
  """The real TFDS loading path, fed by TFDS's own mock of a prepared dataset."""
  import tensorflow_datasets as tfds
  (tmp_path / 'cifar10').mkdir()
  with tfds.testing.mock_data(num_examples=40):
    task = get_task('cifar10_lenet', TaskOptions(cache_dir=str(tmp_path), batch_size=8,
                                                 num_clients=4))
  assert len(task.client_ids) == 4
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  model = task.model_fn()
  out = model.forward_pass(batch, training=False)
  assert out.predictions.shape[-1] == 10 and np.isfinite(float(out.loss))
