"""LIBSVM parsing, the `logistic` task and its numpy objective, `cifar10_lenet`."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import TaskError, TaskOptions, get_task
from tasks import cifar10
from tasks import libsvm
from tasks import partition

PLUS_MINUS = """\
# a comment line
+1 1:0.5 3:2 7:-1.25
-1 2:1
+1 qid:3 1:1 7:1   # trailing comment

-1 5:0.125
"""

MUSHROOM_LIKE = """\
2 1:1 4:1
1 2:1 3:1
2 1:1 3:1
1 4:1
"""


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_parser_reads_sparse_rows_into_dense_float32(tmp_path):
  x, raw = libsvm.parse_libsvm(_write(tmp_path, 'pm.txt', PLUS_MINUS))
  assert x.dtype == np.float32 and x.shape == (4, 7)
  expected = np.zeros((4, 7), np.float32)
  expected[0, [0, 2, 6]] = [0.5, 2, -1.25]
  expected[1, 1] = 1
  expected[2, [0, 6]] = 1
  expected[3, 4] = 0.125
  np.testing.assert_array_equal(x, expected)
  np.testing.assert_array_equal(raw, [1, -1, 1, -1])
  np.testing.assert_array_equal(libsvm.binary_labels(raw), [1, 0, 1, 0])
  wide, _ = libsvm.parse_libsvm(_write(tmp_path, 'pm2.txt', PLUS_MINUS), num_features=9)
  assert wide.shape == (4, 9) and np.array_equal(wide[:, :7], x)


def test_one_two_labels_map_to_zero_one(tmp_path):
  x, raw = libsvm.parse_libsvm(_write(tmp_path, 'm.txt', MUSHROOM_LIKE))
  assert x.shape == (4, 4)
  np.testing.assert_array_equal(libsvm.binary_labels(raw), [1, 0, 1, 0])


@pytest.mark.parametrize('text,message', [
    ('1 0:1\n', 'feature index 0 < 1'),
    ('1 3=2\n', 'not LIBSVM format'),
    ('abc 1:2\n', 'not LIBSVM format'),
    ('# nothing\n', 'has no examples'),
])
def test_parser_errors_name_the_line(tmp_path, text, message):
  with pytest.raises(TaskError, match=message):
    libsvm.parse_libsvm(_write(tmp_path, 'bad.txt', text))


def test_labels_must_be_binary():
  with pytest.raises(TaskError, match='2 label values'):
    libsvm.binary_labels(np.array([1.0, 2.0, 3.0]))


def test_missing_file_is_a_task_error_with_the_fix(tmp_path):
  """It names the file and the fix: where the paper's files come from, and the
  embedded data without the flag."""
  with pytest.raises(TaskError, match=r'cannot read LIBSVM file .*nope.txt.* \(No such file '
                     r'or directory\); give --libsvm_path .*https://www.csie.ntu.edu.tw/.*'
                     r'leave it out for the embedded breast-cancer set'):
    get_task('logistic', TaskOptions(libsvm_path=str(tmp_path / 'nope.txt')))


def test_logistic_task_from_a_libsvm_file(tmp_path):
  rng = np.random.default_rng(0)
  lines = []
  for i in range(40):
    cols = sorted(rng.choice(6, size=3, replace=False) + 1)
    lines.append(f'{1 + i % 2} ' + ' '.join(f'{c}:1' for c in cols))
  path = _write(tmp_path, 'toy.libsvm', '\n'.join(lines) + '\n')
  task = get_task('logistic', TaskOptions(libsvm_path=path, num_clients=4,
                                          partition='sorted', batch_size=5, l2_reg=0.1))
  assert len(task.client_ids) == 4 and task.info['l2_reg'] == 0.1
  assert task.info['num_features'] == 6 and task.info['client_sizes'] == [10] * 4
  labels = [np.unique(task.train_data.client_arrays(c)['y']).tolist()
            for c in task.client_ids]
  assert labels == [[0], [0], [1], [1]]  # label-sorted shards
  batch = next(iter(task.client_dataset(task.client_ids[0])))
  assert batch['x'].shape == (5, 6) and batch['x'].dtype == tf.float32


def test_embedded_default_is_breast_cancer_with_intercept():
  task = get_task('logistic', TaskOptions(num_clients=7, seed=1))
  info = task.info
  assert info['num_train_examples'] == 569 and info['num_features'] == 31
  assert sum(info['client_sizes']) == 569 and len(task.client_ids) == 7
  x = np.concatenate([task.train_data.client_arrays(c)['x'] for c in task.client_ids])
  np.testing.assert_allclose(x[:, -1], 1.0)
  np.testing.assert_allclose(x[:, :-1].mean(axis=0), 0.0, atol=1e-5)
  # Default lambda = L0 / n.
  assert info['l2_reg'] == pytest.approx(info['data_smoothness'] / 569)


def test_partition_schemes_cover_every_example():
  labels = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 0])
  for scheme in partition.SCHEMES:
    parts = partition.split(labels, 3, scheme, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
  parts = partition.split(labels, 2, 'sorted', seed=0)
  assert labels[parts[0]].tolist() == [0] * 5 and labels[parts[1]].tolist() == [1] * 5
  with pytest.raises(ValueError, match='unknown partition'):
    partition.split(labels, 2, 'random', seed=0)


@pytest.fixture(scope='module')
def problem():
  task = get_task('logistic', TaskOptions(num_clients=3, partition='iid'))
  return task, libsvm.problem_of(task)


def test_numpy_gradient_and_smoothness(problem):
  task, prob = problem
  rng = np.random.default_rng(0)
  x, v = rng.normal(size=31) * 0.3, rng.normal(size=31)
  eps = 1e-6
  fd = (prob.loss(x + eps * v) - prob.loss(x - eps * v)) / (2 * eps)
  assert prob.grad(x) @ v == pytest.approx(fd, rel=1e-6)
  # Client-uniform weights: clients of 190, 190, 189 examples weigh 1/3 each.
  sizes = [len(list(task.client_dataset(c).unbatch())) for c in task.client_ids]
  assert sorted(sizes) == [189, 190, 190]
  per_client = np.split(prob.weights, np.cumsum(sizes)[:-1])
  for w, n in zip(per_client, sizes):
    np.testing.assert_allclose(w, 1.0 / (3 * n), rtol=1e-12)
  # L bounds the Hessian everywhere and is attained (up to lambda) at x = 0.
  big = np.linalg.eigvalsh(prob.hessian(np.zeros(31))).max()
  assert big == pytest.approx(prob.smoothness(), rel=1e-12)
  assert np.linalg.eigvalsh(prob.hessian(x)).max() <= prob.smoothness() + 1e-12


def test_newton_solves_to_high_precision(problem):
  _, prob = problem
  x_star, f_star = prob.solve()
  assert np.linalg.norm(prob.grad(x_star)) < 1e-12
  rng = np.random.default_rng(1)
  for _ in range(5):
    assert prob.loss(x_star + 1e-4 * rng.normal(size=31)) > f_star


def test_tff_model_loss_matches_numpy(problem):
  task, prob = problem
  model = task.model_fn()
  x = np.random.default_rng(2).normal(size=31) * 0.2
  model.trainable_variables[0].assign(x)
  cid = task.client_ids[1]
  arrays = task.train_data.client_arrays(cid)
  batch = {'x': tf.constant(arrays['x']), 'y': tf.constant(arrays['y'])}
  out = model.forward_pass(batch)
  one = libsvm.LogisticProblem.from_client_arrays([arrays], prob.l2_reg)
  assert float(out.loss) == pytest.approx(one.loss(x), rel=1e-12)
  assert model.trainable_variables[0].dtype == tf.float64
  metrics = model.report_local_unfinalized_metrics()
  acc = metrics['binary_accuracy'][0] / metrics['binary_accuracy'][1]
  expected = np.mean((arrays['x'].astype(np.float64) @ x > 0) == arrays['y'])
  assert float(acc) == pytest.approx(expected)


def test_with_replacement_draws_n_examples_seeded(problem):
  task, _ = problem
  wr = libsvm.with_replacement(task)
  cid = task.client_ids[0]
  n = len(task.train_data.client_arrays(cid)['y'])
  draw = lambda seed: np.concatenate(
      [b['x'].numpy() for b in wr.client_dataset(cid, seed)])
  a, b, c = draw(5), draw(5), draw(6)
  assert len(a) == n and np.array_equal(a, b) and not np.array_equal(a, c)
  own = task.train_data.client_arrays(cid)['x']
  assert len(np.unique(own, axis=0)) == n
  assert len(np.unique(a, axis=0)) < n  # repeats: drawn with replacement
  assert all((own == row).all(axis=1).any() for row in a)  # the client's own rows
  with pytest.raises(ValueError, match='needs a seed'):
    wr.client_dataset(cid, None)


def test_cifar10_without_data_names_the_directory(tmp_path):
  with pytest.raises(TaskError) as err:
    get_task('cifar10_lenet', TaskOptions(cache_dir=str(tmp_path)))
  assert str(tmp_path / 'cifar10') in str(err.value)


def test_lenet5_shape():
  model = cifar10.lenet5()
  assert model.output_shape == (None, 10)
  # conv 456 + conv 2,416 + fc 48,120 + fc 10,164 + fc 850.
  assert model.count_params() == 62_006
