"""Tests of the TFF-backed tasks: models, synthetic data, SQLite path, errors.

No TFF federated computation runs here (that would start TFF's worker); models
are built as `VariableModel`s and only `forward_pass` is called.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import tarfile
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import models
from tasks import registry
from tasks import tff_data

pytestmark = pytest.mark.usefixtures('offline')  # no test here reaches the network


_SQLITE_NAME = {
    'emnist_autoencoder': 'emnist_all.sqlite',
    'emnist_character': 'emnist_all.sqlite',
    'shakespeare_character': 'shakespeare.sqlite',
    'stackoverflow_tag': 'stackoverflow.sqlite',
    'stackoverflow_word': 'stackoverflow.sqlite',
    'cifar100_image': 'cifar100.sqlite',
}


_TFF_TASKS = tuple(_SQLITE_NAME)  # the tasks over TFF's SQLite datasets


def _spec(name: str) -> registry.TaskSpec:
  return registry.get_spec(name)


def _build(name: str, **options) -> base.Task:
  return _spec(name).builder(registry.TaskOptions(**options))




def _num_examples(dataset: tf.data.Dataset) -> int:
  return sum(int(tf.shape(tf.nest.flatten(b)[0])[0]) for b in dataset)


def _forward(task: base.Task, batch):
  model = task.model_fn()
  assert isinstance(model, tff.learning.models.VariableModel)
  out = model.forward_pass(batch, training=False)
  assert np.isfinite(float(out.loss))
  return model, out


# ------------------------------------------------------------------- models


def test_femnist_cnn_parameter_count():
  model = models.femnist_cnn(62)
  # conv 3*3*1*32+32, conv 3*3*32*64+64, dense 5*5*64*512+512, dense 512*62+62.
  expected = 320 + 18_496 + 819_712 + 31_806
  assert expected == 870_334
  assert model.count_params() == expected
  assert model.input_shape == (None, 28, 28, 1)
  assert model.output_shape == (None, 62)
  assert model.layers[-1].get_config()['activation'] == 'linear'  # logits


def test_cifar_cnn_004_parameter_count():
  model = models.cifar_cnn_004(100)
  assert model.input_shape == (None, 28, 28, 3)
  assert model.count_params() == 896 + 18_496 + 819_712 + 51_300


@pytest.mark.parametrize('units', [256, 128])
def test_shakespeare_gru_layers(units):
  model = models.shakespeare_gru(90, units=units)
  grus = [l for l in model.layers if isinstance(l, tf.keras.layers.GRU)]
  assert [g.units for g in grus] == [units, units]
  assert all(g.return_sequences for g in grus)
  embedding = model.layers[0]
  assert embedding.output_dim == 8 and embedding.mask_zero
  assert model.output_shape == (None, None, 90)


def test_tff_builders_are_tffs():
  assert models.emnist_tff_model('cnn').output_shape == (None, 62)
  assert models.emnist_tff_model('2nn', num_classes=10).output_shape == (
      None, 10)
  assert models.stackoverflow_tag_logreg(50, 7).output_shape == (None, 7)
  lstm = models.shakespeare_lstm(90)
  assert [l.units for l in lstm.layers
          if isinstance(l, tf.keras.layers.LSTM)] == [256, 256]


# ------------------------------------------------- every task and every model


_ALL = [(name, model) for name in _TFF_TASKS for model in registry.get_spec(name).models]


@pytest.mark.parametrize('name', _TFF_TASKS)
def test_default_model_is_registered_and_unknown_models_are_refused(name):
  task = _build(name, use_synthetic_data=True, batch_size=4)
  assert task.info['model'] in _spec(name).models
  with pytest.raises(base.TaskError, match=f"task '{name}' has no model 'no_such_model'"):
    registry.get_task(name, registry.TaskOptions(model='no_such_model',
                                                 use_synthetic_data=True))


@pytest.mark.parametrize('name,model', _ALL)
def test_synthetic_forward_pass(name, model):
  task = _build(name, use_synthetic_data=True, model=model, batch_size=4)
  assert task.info['model'] == model
  assert task.info['source'] == 'synthetic'
  assert task.info['num_train_clients'] == len(task.client_ids) > 0

  batch = next(iter(task.client_dataset(task.client_ids[0], shuffle_seed=0)))
  m, out = _forward(task, batch)
  x, y = batch
  preds = out.predictions
  assert int(preds.shape[0]) == int(x.shape[0]) <= 4
  if name == 'emnist_character':
    assert tuple(preds.shape[1:]) == (62,)
  elif name == 'cifar100_image':
    assert tuple(preds.shape[1:]) == (100,)
    crop = {'resnet18': 24, 'resnet18_gn2': 24, 'cnn004': 28, 'cnn004_code': 32}[model]
    assert tuple(x.shape[1:]) == (crop, crop, 3)
  elif name == 'shakespeare_character':
    assert tuple(preds.shape[1:]) == (80, 90)
  elif name == 'stackoverflow_tag':
    assert tuple(preds.shape[1:]) == (task.info['tag_vocab_size'],)
    assert tuple(y.shape[1:]) == (task.info['tag_vocab_size'],)
  elif name == 'stackoverflow_word':
    assert tuple(preds.shape[1:]) == (20, task.info['extended_vocab_size'])
  elif name == 'emnist_autoencoder':
    assert tuple(preds.shape[1:]) == (784,)
    np.testing.assert_array_equal(x.numpy(), y.numpy())

  names = [v.name for v in m.trainable_variables]
  if name == 'stackoverflow_tag':
    assert 'recall_at_5' in m.report_local_unfinalized_metrics()
  if model in ('resnet18', 'resnet18_gn2'):
    assert any('group_normalization' in n for n in names)
    all_variables = m.trainable_variables + m.non_trainable_variables
    assert not any('batch_normalization' in v.name for v in all_variables)
    norms = [layer for layer in m._keras_model.layers  # pylint: disable=protected-access
             if isinstance(layer, tf.keras.layers.GroupNormalization)]
    # TFF's Keras default, or Reddi et al.'s tfa default of 2020 (models.REDDI_GN_GROUPS).
    assert len(norms) == 20 and {n.groups for n in norms} == {32 if model == 'resnet18' else 2}
  if model == 'gru':
    assert sum('gru' in n and 'recurrent_kernel' in n for n in names) == 2
    assert sorted(tuple(v.shape) for v in m.trainable_variables
                  if 'recurrent_kernel' in v.name) == [(256, 768)] * 2

  test_batch = next(iter(task.test_data))
  assert tf.nest.map_structure(lambda t: t.dtype, test_batch) == (
      tf.nest.map_structure(lambda t: t.dtype, batch))


# ------------------------------------------------ the real SQLite loader path


def _write_sqlite(path, clients):
  """clients: {client_id: (split_name, {feature: array})} in TFF's format."""
  tff.simulation.datasets.save_to_sql_client_data(
      client_ids=list(clients),
      dataset_fn=lambda cid: tf.data.Dataset.from_tensor_slices(
          clients[cid][1]),
      database_filepath=str(path),
      split_names_by_client_id={cid: split for cid, (split, _) in
                                clients.items()})


def _emnist_examples(n, seed):
  rng = np.random.RandomState(seed)
  return collections.OrderedDict(
      label=rng.randint(0, 62, size=n).astype(np.int32),
      pixels=rng.uniform(size=(n, 28, 28)).astype(np.float32))


def test_emnist_sqlite_end_to_end(tmp_path):
  sizes = {'w0': 3, 'w1': 5, 'w2': 7}
  clients = {cid: ('all_train', _emnist_examples(n, i))
             for i, (cid, n) in enumerate(sizes.items())}
  clients['t0'] = ('all_test', _emnist_examples(4, 10))
  clients['t1'] = ('all_test', _emnist_examples(2, 11))
  _write_sqlite(tmp_path / 'emnist_all.sqlite', clients)

  task = _build('emnist_character', cache_dir=str(tmp_path), batch_size=4)
  assert task.client_ids == ['w0', 'w1', 'w2']
  assert task.info['source'] == 'tff_sqlite'
  assert task.info['data_file'] == str(tmp_path / 'emnist_all.sqlite')
  for cid, n in sizes.items():
    raw = task.train_data.create_tf_dataset_for_client(cid)
    assert sum(1 for _ in raw) == n
    batches = list(task.client_dataset(cid))  # one epoch, unshuffled
    assert len(batches) == math.ceil(n / 4)
    labels = np.concatenate([y.numpy() for _, y in batches])
    np.testing.assert_array_equal(labels, clients[cid][1]['label'])
    pixels = np.concatenate([x.numpy() for x, _ in batches])[..., 0]
    np.testing.assert_allclose(pixels, clients[cid][1]['pixels'])
  assert _num_examples(task.test_data) == 6

  batch = next(iter(task.client_dataset('w2', shuffle_seed=0)))
  _, out = _forward(task, batch)
  assert tuple(out.predictions.shape) == (4, 62)

  subset = _build('emnist_character', cache_dir=str(tmp_path), num_clients=2,
                  seed=3)
  assert len(subset.client_ids) == 2
  assert set(subset.client_ids) <= set(sizes)
  assert subset.info['num_available_train_clients'] == 3
  with pytest.raises(base.TaskError, match='only 3 training clients'):
    _build('emnist_character', cache_dir=str(tmp_path), num_clients=4)


def test_shakespeare_sqlite_end_to_end(tmp_path):
  lines = [b'To be, or not to be: that is the question.',
           b'Whether \'tis nobler in the mind to suffer',
           b'The slings and arrows of outrageous fortune,']
  clients = {
      'HAMLET': ('train', {'snippets': np.array(lines)}),
      'OPHELIA': ('train', {'snippets': np.array(lines[:1])}),
      'HAMLET_test': ('test', {'snippets': np.array(lines[1:])}),
  }
  _write_sqlite(tmp_path / 'shakespeare.sqlite', clients)
  task = _build('shakespeare_character', cache_dir=str(tmp_path), model='gru',
                batch_size=2)
  assert task.client_ids == ['HAMLET', 'OPHELIA']
  assert sum(1 for _ in task.train_data.create_tf_dataset_for_client(
      'HAMLET')) == 3
  x, y = next(iter(task.client_dataset('HAMLET', shuffle_seed=0)))
  assert x.shape == (2, 80) and y.shape == (2, 80)
  _, out = _forward(task, (x, y))
  assert tuple(out.predictions.shape) == (2, 80, 90)


def _stackoverflow_examples(n, seed):
  rng = np.random.RandomState(seed)
  words = ['how', 'do', 'i', 'sort', 'a', 'list', 'in', 'python', 'java']
  tags = ['python', 'list', 'java', 'sorting', 'arrays', 'c++']
  def text(k):
    return ' '.join(rng.choice(words, size=k)).encode()
  return collections.OrderedDict(
      creation_date=np.array([b'2010-01-08 09:34:05 UTC'] * n),
      score=rng.randint(0, 100, size=n).astype(np.int64),
      tags=np.array([b'|'.join(t.encode() for t in rng.choice(tags, 2))
                     for _ in range(n)]),
      title=np.array([text(4) for _ in range(n)]),
      tokens=np.array([text(8) for _ in range(n)]),
      type=np.array([b'question'] * n))


def _write_stackoverflow(tmp_path):
  clients = {
      'u1': ('train', _stackoverflow_examples(3, 1)),
      'u2': ('train', _stackoverflow_examples(5, 2)),
      'h1': ('heldout', _stackoverflow_examples(2, 3)),
      't1': ('test', _stackoverflow_examples(4, 4)),
  }
  _write_sqlite(tmp_path / 'stackoverflow.sqlite', clients)


def test_stackoverflow_sqlite_end_to_end(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))  # no ~/.keras files
  _write_stackoverflow(tmp_path)
  words = ['how', 'do', 'i', 'sort', 'a', 'list', 'in', 'python']
  (tmp_path / 'stackoverflow.word_count').write_text(
      ''.join(f'{w} {100 - i}\n' for i, w in enumerate(words)))
  # The tag counts as TFF ships them: a .tar.bz2 under <cache_dir>/datasets.
  datasets_dir = tmp_path / 'datasets'
  datasets_dir.mkdir()
  tag_json = tmp_path / 'stackoverflow.tag_count'
  tag_json.write_text(json.dumps(
      {'python': 5, 'list': 3, 'java': 7, 'sorting': 1, 'arrays': 2, 'c++': 4}))
  archive = datasets_dir / 'stackoverflow.tag_count.tar.bz2'
  with tarfile.open(archive, 'w:bz2') as tar:
    tar.add(tag_json, arcname='stackoverflow.tag_count')
  tag_json.unlink()
  spec = tff_data.STACKOVERFLOW_COUNTS['tag']
  monkeypatch.setitem(
      tff_data.STACKOVERFLOW_COUNTS, 'tag', dataclasses.replace(
          spec, sha256=hashlib.sha256(archive.read_bytes()).hexdigest()))

  assert tff_data.stackoverflow_vocab('tag', 2, str(tmp_path)) == [
      'java', 'python']
  assert (datasets_dir / 'stackoverflow.tag_count').exists()

  task = _build('stackoverflow_tag', cache_dir=str(tmp_path), batch_size=2)
  assert task.client_ids == ['u1', 'u2']
  assert task.info['word_vocab_size'] == len(words)
  assert task.info['tag_vocab_size'] == 6  # < TFF's 500: all of them
  assert sum(1 for _ in task.train_data.create_tf_dataset_for_client(
      'u2')) == 5
  assert _num_examples(task.client_dataset('u2', shuffle_seed=0)) == 5
  x, y = next(iter(task.client_dataset('u1', shuffle_seed=0)))
  assert x.shape == (2, len(words)) and y.shape == (2, 6)
  model, out = _forward(task, (x, y))
  assert tuple(out.predictions.shape) == (2, 6)
  assert 'recall_at_5' in model.report_local_unfinalized_metrics()
  assert _num_examples(task.test_data) == 4

  word_task = _build('stackoverflow_word', cache_dir=str(tmp_path),
                     batch_size=2)
  assert word_task.info['vocab_size'] == len(words)
  batch = next(iter(word_task.client_dataset('u2', shuffle_seed=0)))
  _, out = _forward(word_task, batch)
  assert tuple(out.predictions.shape[1:]) == (
      20, word_task.info['extended_vocab_size'])


def _stackoverflow_with_counts(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  _write_stackoverflow(tmp_path)
  words = ['how', 'do', 'i', 'sort', 'a', 'list', 'in', 'python']
  (tmp_path / 'stackoverflow.word_count').write_text(
      ''.join(f'{w} {100 - i}\n' for i, w in enumerate(words)))
  (tmp_path / 'stackoverflow.tag_count').write_text(json.dumps(
      {'python': 5, 'list': 3, 'java': 7, 'sorting': 1, 'arrays': 2, 'c++': 4}))


def test_client_cap_keeps_the_first_examples_and_test_set_is_fixed(tmp_path, monkeypatch):
  # Paper 000, App. B: at most 250 samples per client, a fixed 10,000-sample test set.
  _stackoverflow_with_counts(tmp_path, monkeypatch)
  full = registry.get_task('stackoverflow_tag', registry.TaskOptions(
      cache_dir=str(tmp_path), batch_size=1))
  capped = registry.get_task('stackoverflow_tag', registry.TaskOptions(
      cache_dir=str(tmp_path), batch_size=1, max_client_examples=2, test_examples=3))
  assert _num_examples(capped.client_dataset('u2', shuffle_seed=0)) == 2
  assert _num_examples(capped.client_dataset('u1')) == 2
  first_two = [x.numpy() for x, _ in full.client_dataset('u2')][:2]
  for seed in (0, 1, 2):  # the same two examples whatever the round's shuffle
    got = sorted(x.numpy().tobytes() for x, _ in capped.client_dataset('u2', shuffle_seed=seed))
    assert got == sorted(x.tobytes() for x in first_two)
  assert _num_examples(capped.test_data) == 3
  first = [b[0].numpy() for b in capped.test_data]
  again = [b[0].numpy() for b in capped.test_data]
  np.testing.assert_array_equal(np.concatenate(first), np.concatenate(again))
  np.testing.assert_array_equal(np.concatenate(first),
                                np.concatenate([b[0].numpy() for b in full.test_data])[:3])
  assert capped.info['max_client_examples'] == 2 and capped.info['test_examples'] == 3
  with pytest.raises(base.TaskError, match='max_client_examples'):
    registry.get_task('stackoverflow_tag', registry.TaskOptions(max_client_examples=0))
  with pytest.raises(base.TaskError, match='not supported by task'):
    registry.get_task('digits', registry.TaskOptions(max_client_examples=5))


def test_stackoverflow_logreg_mean_averages_the_loss_over_the_batch(tmp_path, monkeypatch):
  _stackoverflow_with_counts(tmp_path, monkeypatch)
  summed = _build('stackoverflow_tag', cache_dir=str(tmp_path), batch_size=4)
  mean = _build('stackoverflow_tag', cache_dir=str(tmp_path), batch_size=4,
                model='logreg_mean')
  batch = next(iter(summed.client_dataset('u2')))
  m_sum, m_mean = summed.model_fn(), mean.model_fn()
  for v_mean, v_sum in zip(m_mean.trainable_variables, m_sum.trainable_variables):
    v_mean.assign(v_sum)
  loss_sum = float(m_sum.forward_pass(batch, training=False).loss)
  loss_mean = float(m_mean.forward_pass(batch, training=False).loss)
  assert loss_mean == pytest.approx(loss_sum / 4, rel=1e-5)
  assert mean.info['model'] == 'logreg_mean'
  assert 'recall_at_5' in m_mean.report_local_unfinalized_metrics()


def test_stackoverflow_missing_counts(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  _write_stackoverflow(tmp_path)
  start = time.monotonic()
  with pytest.raises(base.TaskError) as err:
    _build('stackoverflow_tag', cache_dir=str(tmp_path))
  assert time.monotonic() - start < 10
  message = str(err.value)
  assert 'stackoverflow.word_count' in message
  assert str(tmp_path) in message
  assert 'stackoverflow.word_count.tar.bz2' in message


def _cifar100_examples(rng: np.random.RandomState, n: int) -> collections.OrderedDict:
  """n random examples in the layout of TFF's cifar100.sqlite."""
  return collections.OrderedDict(
      coarse_label=rng.randint(0, 20, size=n).astype(np.int64),
      image=rng.randint(0, 256, size=(n, 32, 32, 3)).astype(np.uint8),
      label=rng.randint(0, 100, size=n).astype(np.int64))


def test_cifar100_sqlite_end_to_end(tmp_path):
  rng = np.random.RandomState(0)
  examples = functools.partial(_cifar100_examples, rng)
  clients = {'0': ('train', examples(3)), '1': ('train', examples(2)),
             '7': ('test', examples(5))}
  _write_sqlite(tmp_path / 'cifar100.sqlite', clients)
  task = _build('cifar100_image', cache_dir=str(tmp_path), model='cnn004',
                batch_size=3)
  assert task.client_ids == ['0', '1']
  raw = list(task.train_data.create_tf_dataset_for_client('0'))
  np.testing.assert_array_equal(raw[0]['image'].numpy(),
                                clients['0'][1]['image'][0])
  x, y = next(iter(task.client_dataset('0', shuffle_seed=0)))
  assert x.shape == (3, 28, 28, 3)
  _, out = _forward(task, (x, y))
  assert tuple(out.predictions.shape) == (3, 100)
  assert _num_examples(task.test_data) == 5


def test_cifar100_authors_code_pipeline(tmp_path):
  """cnn004_code: whole 32x32 images normalised by the FedGBO code's fixed
  per-channel values; a training batch flipped and cropped at ONE draw from its
  4-pixel zero padding (torchvision on a batch tensor); the CNN's first dense
  layer takes 6*6*64 = 2304 inputs, as the code's."""
  from tasks import cifar100
  rng = np.random.RandomState(1)
  examples = functools.partial(_cifar100_examples, rng)
  clients = {'0': ('train', examples(4)), '7': ('test', examples(5))}
  _write_sqlite(tmp_path / 'cifar100.sqlite', clients)
  task = _build('cifar100_image', cache_dir=str(tmp_path), model='cnn004_code',
                batch_size=4)
  means, stds = np.array(cifar100.CODE_MEANS), np.array(cifar100.CODE_STDS)
  normalised = (clients['0'][1]['image'] / 255.0 - means) / stds
  x, _ = next(iter(task.client_dataset('0')))  # no augmentation seed: whole images
  np.testing.assert_allclose(x.numpy(), normalised, rtol=1e-5, atol=1e-5)
  test_x = np.concatenate([b[0].numpy() for b in task.test_data])
  assert test_x.shape == (5, 32, 32, 3)
  offsets = set()
  for seed in range(12):
    x, y = next(iter(task.client_dataset('0', augment_seed=seed)))
    assert x.shape == (4, 32, 32, 3)
    padded = np.pad(normalised, [(0, 0), (4, 4), (4, 4), (0, 0)])
    found = [(flip, dy, dx) for flip in (False, True) for dy in range(9) for dx in range(9)
             if np.allclose((padded[:, :, ::-1] if flip else padded)[:, dy:dy + 32, dx:dx + 32],
                            x.numpy(), atol=1e-5)]
    assert found, seed  # one flip and one offset for the whole batch
    offsets.add(found[0])
  assert len(offsets) > 3  # the draws vary with the seed
  keras = models.cifar_cnn_004(100, size=32)
  dense = [l for l in keras.layers if isinstance(l, tf.keras.layers.Dense)]
  assert dense[0].kernel.shape == (2304, 512)
  _, out = _forward(task, (x, y))
  assert tuple(out.predictions.shape) == (4, 100)


# ---------------------------------------------------------- missing files


@pytest.mark.parametrize('name', _TFF_TASKS)
def test_missing_file_fails_fast(name, tmp_path):
  start = time.monotonic()
  with pytest.raises(base.TaskError) as err:
    _build(name, cache_dir=str(tmp_path))
  assert time.monotonic() - start < 10
  message = str(err.value)
  file_name = _SQLITE_NAME[name]
  assert os.path.join(str(tmp_path), file_name) in message
  assert (f'https://storage.googleapis.com/tff-datasets-public/'
          f'{file_name}.lzma') in message
  assert '--use_synthetic_data' in message
  assert not os.path.exists(tmp_path / file_name)


def test_default_cache_dir_is_tffs(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path))
  assert tff_data.default_cache_dir() == str(tmp_path / '.tff')
  assert tff_data.sqlite_path('emnist') == str(tmp_path / '.tff' /
                                               'emnist_all.sqlite')
  with pytest.raises(base.TaskError, match='.tff'):
    _build('emnist_character')


@pytest.mark.parametrize('content,match', [
    (b'', 'tables'), (b'not a database at all' * 100, 'not a readable')])
def test_corrupt_file(tmp_path, content, match):
  (tmp_path / 'emnist_all.sqlite').write_bytes(content)
  with pytest.raises(base.TaskError, match=match):
    _build('emnist_character', cache_dir=str(tmp_path))


def test_download_flag(monkeypatch):
  assert not tff_data.download_allowed()
  assert tff_data.download_allowed(True)
  monkeypatch.setenv(tff_data.ALLOW_DOWNLOAD_ENV, '1')
  assert tff_data.download_allowed()
  assert not tff_data.download_allowed(False)


def test_download_flag_hands_over_to_tff(tmp_path, monkeypatch):
  # With downloads allowed, a missing file goes to TFF's downloader, which here
  # hits the blocked network (proving the default path never gets that far).
  monkeypatch.setenv(tff_data.ALLOW_DOWNLOAD_ENV, '1')
  with pytest.raises(AssertionError, match='network access attempted'):
    _build('cifar100_image', cache_dir=str(tmp_path), model='cnn004')
