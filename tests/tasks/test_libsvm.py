"""LIBSVM parsing (and the refusal of hostile files), the `logistic` task and
its numpy objective, `cifar10_lenet`."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from binaries import assert_refused, run_binary
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


def test_labels_must_be_binary():
  with pytest.raises(TaskError, match=r'^f.txt: binary classification needs 2 label values, '
                     r'got 3: \[1.0, 2.0, 3.0\]; give data whose labels take exactly two'):
    libsvm.binary_labels(np.array([1.0, 2.0, 3.0]), 'f.txt')


# ------------------------------------------------------------ hostile files

GOOD = '+1 1:0.5 3:2\n-1 2:1\n'

# (file bytes, the refusal after '<path>:'), each a file the loader must refuse.
HOSTILE = {
    'nan value': (b'1 1:1\n-1 1:0.5 2:nan\n', "2: feature value 'nan' is not a finite "
                  'number; fix or remove the line'),
    'inf value': (b'1 1:1e400\n', "1: feature value '1e400' is not a finite number"),
    'inf literal': (b'1 1:-inf\n', "1: feature value '-inf' is not a finite number"),
    'float32 overflow': (b'1 1:1e39\n', "1: feature value '1e39' is outside float32's range"),
    'nan label': (b'nan 1:1\n', "1: label 'nan' is not a finite number"),
    'inf label': (b'1e400 1:1\n', "1: label '1e400' is not a finite number"),
    'word label': (b'1 1:1\nabc 1:2\n', "2: label 'abc' is not a number; fix or remove"),
    'no colon': (b'1 3=2\n', "1: '3=2' is not an index:value pair"),
    'empty value': (b'1 3:\n', "1: feature value '' is not a number"),
    'two colons': (b'1 3:2:1\n', "1: feature value '2:1' is not a number"),
    'word value': (b'1 3:x\n', "1: feature value 'x' is not a number"),
    'empty index': (b'1 :2\n', "1: feature index '' is not an integer"),
    'float index': (b'1 1.5:2\n', "1: feature index '1.5' is not an integer"),
    'word index': (b'1 a:2\n', "1: feature index 'a' is not an integer"),
    'index 0': (b'1 0:1\n', "1: feature index '0' is below 1 (LIBSVM indices start at 1)"),
    'negative index': (b'1 -3:1\n', "1: feature index '-3' is below 1"),
    'huge index': (b'1 1:1\n-1 99999999999:1\n', "2: feature index '99999999999' is over "
                   '16,384: that many features need 67.8 ZiB for the d x d smoothness '
                   "matrix, over the loader's 2 GiB"),
    'index of 5000 digits': (b'1 ' + b'9' * 5000 + b':1\n', "1: feature index '" + '9' * 40
                             + "...' is over 16,384: that many features need more than "),
    'one index too many': (b'1 16385:1\n', "1: feature index '16385' is over 16,384: that "
                           "many features need 2.01 GiB for the d x d smoothness matrix"),
    'duplicate index': (b'1 1:1 3:1 3:2\n', '1: feature index 3 is given twice; keep one'),
    'non-UTF-8 byte': (b'1 1:1\n-1 2:1 \xff\n', '2: byte 0xff (byte 8 of the line) is not '
                       'UTF-8 text; give a LIBSVM text file'),
    'binary bytes': (bytes(range(255, -1, -1)) * 4, '1: byte 0xff (byte 1 of the line) is not '
                     'UTF-8 text'),
    'NUL bytes': (b'1 1:1\x00\n', "1: feature value '1\\x00' is not a number"),
    'a line of 64 MiB': (b'1' * (64 * 1024**2 + 1), '1: the line is longer than 64 MiB'),
}


@pytest.mark.parametrize('case', HOSTILE)
def test_hostile_file_is_one_line_naming_file_line_and_problem(tmp_path, case):
  data, said = HOSTILE[case]
  path = tmp_path / 'f.libsvm'
  path.write_bytes(data)
  with pytest.raises(TaskError) as err:
    libsvm.parse_libsvm(str(path))
  message = str(err.value)
  assert message.startswith(f'{path}:{said}'), message
  assert '\n' not in message and len(message) < 400, message


@pytest.mark.parametrize('name,data,said', [
    ('empty.txt', b'', "has no examples (only blank or # lines); give a file with lines"),
    ('blank.txt', b'\n  \n# comment\n\r\n', 'has no examples'),
    ('notgz.gz', b'1 1:1\n', "cannot read it (Not a gzipped file (b'1 ')); the file is damaged"),
    ('cut.gz', gzip.compress(GOOD.encode() * 50)[:40], 'cannot read beyond line 100 '
     '(Compressed file ended before the end-of-stream marker was reached); the file is'),
    ('bad.bz2', b'BZh9' + bytes(60), 'cannot read it (Invalid data stream); the file is'),
], ids=['empty', 'blank', 'not gzip', 'cut gzip', 'bad bz2'])
def test_empty_or_damaged_file_is_one_line_naming_it(tmp_path, name, data, said):
  path = tmp_path / name
  path.write_bytes(data)
  with pytest.raises(TaskError) as err:
    libsvm.parse_libsvm(str(path))
  assert str(path) in str(err.value) and said in str(err.value), str(err.value)
  assert '\n' not in str(err.value)


def test_too_many_examples_for_dense_features_is_refused_before_allocating(tmp_path):
  """16,384 features x 32,769 examples is 2 GiB + 64 KiB of float32: refused
  while reading, at the example that passes the limit."""
  path = _write(tmp_path, 'wide.txt', '1 16384:1\n' + '-1 1:1\n' * 40_000)
  with pytest.raises(TaskError) as err:
    libsvm.parse_libsvm(path)
  assert str(err.value) == (
      f"{path}: 32,769 examples x 16,384 features (or more) need 2.01 GiB of dense float32 "
      "features, over the loader's 2 GiB (tasks.libsvm.MAX_DENSE_BYTES); use fewer examples "
      "or features")
  with pytest.raises(TaskError, match='num_features=20000 is over'):
    libsvm.parse_libsvm(_write(tmp_path, 'ok.txt', GOOD), num_features=20_000)
  with pytest.raises(TaskError, match=r":1: feature index '3' > num_features=2; fix or"):
    libsvm.parse_libsvm(_write(tmp_path, 'ok.txt', GOOD), num_features=2)


def test_what_the_loader_accepts(tmp_path):
  """Indices in any order (the features are dense; each keeps its value),
  leading zeros and '+', a UTF-8 BOM, CRLF and lone-CR line ends, and one
  line of 16,384 features padded to 2 MiB."""
  x, raw = libsvm.parse_libsvm(_write(
      tmp_path, 'order.txt', '\ufeff+1 3:2 1:0.5 qid:7\r\n-1 +02:1\r1 003:-1\n'))
  np.testing.assert_array_equal(x, [[0.5, 0, 2], [0, 1, 0], [0, 0, -1]])
  np.testing.assert_array_equal(raw, [1, -1, 1])
  row = ' '.join(f'{i}:{i % 7 - 3}' for i in range(16384, 0, -1))
  x, raw = libsvm.parse_libsvm(_write(tmp_path, 'long.txt', '1 ' + row.ljust(2 * 1024**2)
                                      + '\n-1 5:1\n'))
  assert x.shape == (2, 16384) and x[0, 16383] == 16384 % 7 - 3 and x[1, 4] == 1


def test_non_finite_features_never_reach_the_smoothness_estimate():
  with pytest.raises(TaskError, match=r'^the features hold a value that is not a finite'):
    libsvm.data_smoothness(np.array([[1.0, np.nan]], np.float32))
  with pytest.raises(TaskError, match=r'^16,385 features need 2.01 GiB for the d x d'):
    libsvm.data_smoothness(np.zeros((1, 16385), np.float32))


def _refused_or_loaded(path):
  """A valid load (finite float32, one label per row) or one refusal line."""
  try:
    x, raw = libsvm.parse_libsvm(str(path))
  except TaskError as e:
    assert str(path) in str(e) and '\n' not in str(e), str(e)
    return 'refused'
  assert x.dtype == np.float32 and len(x) == len(raw) > 0
  assert np.isfinite(x).all() and np.isfinite(raw).all()
  return 'loaded'


def test_random_bytes_load_or_are_refused_in_one_line(tmp_path):
  """Seeded random bytes, random LIBSVM-ish text, and valid files (plain and
  gzip) with random bytes overwritten: never another exception."""
  rng = np.random.default_rng(45)
  valid = ''.join(f'{rng.choice([-1, 1])} ' + ' '.join(
      f'{j}:{rng.normal():.4f}' for j in sorted(rng.choice(50, 5, replace=False) + 1)) + '\n'
      for _ in range(40)).encode()
  alphabet = np.frombuffer(b'0123456789 :.-+eEinaf#\n\r\t\xff', np.uint8)
  outcomes = []
  for i in range(75):
    kind = i % 5  # random bytes, random text, valid with bytes / digits overwritten, gzip
    if kind == 0:
      data = rng.integers(0, 256, rng.integers(1, 2000), np.uint8).tobytes()
    elif kind == 1:
      data = rng.choice(alphabet, rng.integers(1, 2000)).astype(np.uint8).tobytes()
    else:
      base = bytearray(gzip.compress(valid) if kind == 4 else valid)
      for at in rng.integers(0, len(base), rng.integers(1, 4)):
        base[at] = rng.integers(48, 58) if kind == 3 else rng.integers(0, 256)  # 48-57: digits
      data = bytes(base)
    path = tmp_path / f'r{i}{".gz" if kind == 4 else ""}'
    path.write_bytes(data)
    outcomes.append(_refused_or_loaded(path))
  assert 'refused' in outcomes and 'loaded' in outcomes  # both paths were exercised


def test_train_binary_refuses_a_nan_file_in_one_line(tmp_path):
  path = tmp_path / 'nan.libsvm'
  path.write_text('1 1:0.5 2:1\n-1 2:1\n+1 1:nan\n')
  res = run_binary('train', '--task=logistic', f'--libsvm_path={path}',
                   f'--root_output_dir={tmp_path}/runs', '--noprogress', cwd=tmp_path,
                   timeout=300)
  line = assert_refused(res, before_tensorflow=False)
  assert line == (f"error: {path}:3: feature value 'nan' is not a finite number; "
                  'fix or remove the line')
  assert res.stderr.strip().splitlines() == [line]
  assert not (tmp_path / 'runs').exists()  # the refused run left no empty root behind


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
