"""Client splits of centralised data, and the embedded digits task."""

import numpy as np
import pytest

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
