"""Loading TFF's four SQLite datasets offline; fails fast on a missing file.

TFF's loaders (`tff.simulation.datasets.{emnist,shakespeare,stackoverflow,
cifar100}.load_data`) read `<cache_dir>/<file>.sqlite` and, when it is missing,
download `<file>.sqlite.lzma` from TFF's public bucket and decompress it there
(`tff.simulation.datasets.download.get_compressed_file`; `cache_dir=None` means
`~/.tff`). These machines cannot download, so `load` checks for the file first
and raises `MissingData` (one line: the file, the directory, the URL). Setting the
environment variable TFF_ALGOS_ALLOW_DOWNLOAD=1 lets TFF try the download.

StackOverflow also needs TFF's word and tag count files, which TFF fetches with
`tf.keras.utils.get_file` into `~/.keras/datasets` (TFF's baseline tasks do not
forward `cache_dir` to them); `stackoverflow_vocab` looks for them offline.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import pathlib
import sqlite3
import tarfile
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.base import Task, TaskError
from tasks.options import MissingData

ALLOW_DOWNLOAD_ENV = 'TFF_ALGOS_ALLOW_DOWNLOAD'
_BUCKET = 'https://storage.googleapis.com/tff-datasets-public/'
# Tables every TFF SQLite file has (see tff.simulation.datasets.SqlClientData).
_REQUIRED_TABLES = frozenset({'examples', 'client_metadata'})


@dataclasses.dataclass(frozen=True)
class SqliteFile:
  """One of TFF's SQLite dataset files."""
  dataset: str
  file_name: str    # what the loader opens inside cache_dir
  train_split: str  # `split_name` of the training clients

  @property
  def url(self) -> str:
    return f'{_BUCKET}{self.file_name}.lzma'


# File names and split names as read by TFF 0.87's loaders. EMNIST has ONE file
# for both variants: splits all_train/all_test (62 classes) and
# digits_only_train/digits_only_test (10 classes).
SQLITE_FILES = {
    'emnist': SqliteFile('emnist', 'emnist_all.sqlite', 'all_train'),
    'shakespeare': SqliteFile('shakespeare', 'shakespeare.sqlite', 'train'),
    'stackoverflow': SqliteFile('stackoverflow', 'stackoverflow.sqlite',
                                'train'),
    'cifar100': SqliteFile('cifar100', 'cifar100.sqlite', 'train'),
}


@dataclasses.dataclass(frozen=True)
class CountsFile:
  """A StackOverflow word/tag count archive fetched by TFF via keras."""
  archive: str  # file name of the archive (and of the download)
  member: str   # the file inside it that TFF reads
  sha256: str   # hash TFF checks the archive against

  @property
  def url(self) -> str:
    return f'{_BUCKET}{self.archive}'


STACKOVERFLOW_COUNTS = {
    'word': CountsFile(
        'stackoverflow.word_count.tar.bz2', 'stackoverflow.word_count',
        '1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c'),
    'tag': CountsFile(
        'stackoverflow.tag_count.tar.bz2', 'stackoverflow.tag_count',
        '6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d'),
}

_LOADERS = {
    'emnist': lambda d: tff.simulation.datasets.emnist.load_data(
        only_digits=False, cache_dir=d),
    'shakespeare': lambda d: tff.simulation.datasets.shakespeare.load_data(
        cache_dir=d),
    'stackoverflow': lambda d: tff.simulation.datasets.stackoverflow.load_data(
        cache_dir=d),
    'cifar100': lambda d: tff.simulation.datasets.cifar100.load_data(
        cache_dir=d),
}

_SYNTHETIC = {
    'emnist': tff.simulation.datasets.emnist.get_synthetic,
    'shakespeare': tff.simulation.datasets.shakespeare.get_synthetic,
    'stackoverflow': tff.simulation.datasets.stackoverflow.get_synthetic,
    'cifar100': tff.simulation.datasets.cifar100.get_synthetic,
}


@dataclasses.dataclass(frozen=True)
class RawData:
  """Raw (unpreprocessed) client data of one dataset."""
  train: tff.simulation.datasets.ClientData
  test: tff.simulation.datasets.ClientData
  validation: Optional[tff.simulation.datasets.ClientData]
  source: str                 # 'tff_sqlite' or 'synthetic'
  data_file: Optional[str]    # the SQLite file read, if any


def default_cache_dir() -> str:
  """Where TFF's loaders cache when `cache_dir` is None: `~/.tff`."""
  return os.path.join(os.path.expanduser('~'), '.tff')


def resolve_cache_dir(cache_dir: Optional[str]) -> str:
  if not cache_dir:
    return default_cache_dir()
  return os.path.abspath(os.path.expanduser(cache_dir))


def sqlite_path(dataset: str, cache_dir: Optional[str] = None) -> str:
  """The exact path TFF's loader opens for `dataset`."""
  return os.path.join(resolve_cache_dir(cache_dir),
                      SQLITE_FILES[dataset].file_name)


def download_allowed(allow_download: Optional[bool] = None) -> bool:
  """Explicit argument, else the TFF_ALGOS_ALLOW_DOWNLOAD environment flag."""
  if allow_download is not None:
    return allow_download
  return os.environ.get(ALLOW_DOWNLOAD_ENV, '').lower() in ('1', 'true', 'yes')


def _missing(what: str, file_name: str, directory: str, url: str, how_to_unpack: str,
             also: str = '') -> MissingData:
  """One line: downloads are off by default (these machines have no internet
  access, so a missing file fails fast instead of hanging)."""
  return MissingData(
      f'{what} not found: {os.path.join(directory, file_name)}{also}',
      f'download {url} elsewhere, {how_to_unpack} and put {file_name} in {directory} '
      f'(or pass --cache_dir), or set {ALLOW_DOWNLOAD_ENV}=1 to let TFF download it')


def check_sqlite(dataset: str, cache_dir: Optional[str] = None) -> str:
  """Returns the SQLite path if it is present and readable, else TaskError."""
  spec = SQLITE_FILES[dataset]
  path = sqlite_path(dataset, cache_dir)
  if not os.path.isfile(path):
    raise _missing(f'{dataset} data file', spec.file_name, os.path.dirname(path),
                   spec.url, f'decompress it (`xz -d {spec.file_name}.lzma`)')
  try:
    uri = pathlib.Path(path).as_uri() + '?mode=ro'
    with sqlite3.connect(uri, uri=True) as con:
      tables = {row[0] for row in con.execute(
          "SELECT name FROM sqlite_master WHERE type = 'table'")}
  except sqlite3.DatabaseError as e:
    raise TaskError(f'{path} is not a readable SQLite database ({e}); an '
                    'interrupted download leaves such a file: delete it and '
                    f'fetch {spec.url} again') from e
  missing = _REQUIRED_TABLES - tables
  if missing:
    raise TaskError(f'{path} is not in TFF\'s SQLite format: tables '
                    f'{sorted(missing)} are missing (possibly an interrupted '
                    f'download; delete it and fetch {spec.url} again)')
  return path


def load(dataset: str, cache_dir: Optional[str] = None,
         use_synthetic_data: bool = False,
         allow_download: Optional[bool] = None) -> RawData:
  """Raw train/test(/validation) ClientData of a TFF dataset.

  Args:
    dataset: 'emnist' (the 62-class split), 'shakespeare', 'stackoverflow' or
      'cifar100'.
    cache_dir: directory holding the SQLite file; None means TFF's `~/.tff`.
    use_synthetic_data: use TFF's `get_synthetic()` data instead (offline).
    allow_download: let TFF download a missing file; None reads the
      TFF_ALGOS_ALLOW_DOWNLOAD environment flag (default: off, fail fast).

  Returns:
    A `RawData`; StackOverflow's held-out split is its `validation`.

  Raises:
    TaskError: the file is missing (and downloads are off) or unreadable.
  """
  if dataset not in SQLITE_FILES:
    raise TaskError(f'unknown TFF dataset {dataset!r}')
  if use_synthetic_data:
    data = _SYNTHETIC[dataset]()
    validation = data if dataset == 'stackoverflow' else None
    return RawData(data, data, validation, 'synthetic', None)

  spec = SQLITE_FILES[dataset]
  directory = resolve_cache_dir(cache_dir)
  path = sqlite_path(dataset, directory)
  if os.path.exists(path) or not download_allowed(allow_download):
    check_sqlite(dataset, directory)  # else TFF's loader downloads it
  try:
    splits = _LOADERS[dataset](directory)
  except (tff.simulation.datasets.sql_client_data.DatabaseFormatError,
          sqlite3.DatabaseError) as e:
    raise TaskError(f'cannot read {path}: {e}') from e
  if dataset == 'stackoverflow':
    train, validation, test = splits
  else:
    (train, test), validation = splits, None
  if not train.client_ids:
    raise TaskError(f'{path} has no clients in split {spec.train_split!r}')
  return RawData(train, test, validation, 'tff_sqlite', path)


# ------------------------------------------------------- StackOverflow vocab


def _counts_dirs(cache_dir: Optional[str]) -> list[str]:
  """Where to look for the count files, in order."""
  base = resolve_cache_dir(cache_dir)
  keras_default = os.path.join(os.path.expanduser('~'), '.keras', 'datasets')
  dirs = [base, os.path.join(base, 'datasets'), keras_default]
  return list(dict.fromkeys(dirs))


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _extract_member(archive_path: str, spec: CountsFile) -> str:
  """Verifies TFF's hash and extracts the counts file next to the archive."""
  if _sha256(archive_path) != spec.sha256:
    raise TaskError(f'{archive_path} does not have the sha256 TFF expects '
                    f'({spec.sha256}); delete it and fetch {spec.url} again')
  target = os.path.join(os.path.dirname(archive_path), spec.member)
  with tarfile.open(archive_path) as tar:
    member = tar.extractfile(spec.member)
    if member is None:
      raise TaskError(f'{archive_path} holds no file {spec.member!r}')
    with open(target + '.part', 'wb') as out:
      out.write(member.read())
  os.replace(target + '.part', target)
  return target


def _read_counts(kind: str, path: str) -> list[str]:
  """Keys of a counts file in TFF's order (word file order; tags by count)."""
  if kind == 'word':
    with open(path) as f:
      return [line.split()[0] for line in f if line.strip()]
  with open(path) as f:
    counts = json.load(f)
  # Same order as tff.simulation.datasets.stackoverflow.load_tag_counts.
  return [tag for tag, _ in sorted(counts.items(), key=lambda kv: kv[1],
                                   reverse=True)]


def stackoverflow_vocab(kind: str, size: int, cache_dir: Optional[str] = None,
                        allow_download: Optional[bool] = None) -> list[str]:
  """The `size` most frequent StackOverflow words (`kind='word'`) or tags.

  Looks, in order, in `cache_dir`, `cache_dir/datasets` and `~/.keras/datasets`
  (TFF's own location) for the extracted counts file, then for its `.tar.bz2`
  archive (hash-checked and extracted in place). With downloads allowed, a
  missing file is fetched by TFF into `cache_dir/datasets`.
  """
  spec = STACKOVERFLOW_COUNTS[kind]
  dirs = _counts_dirs(cache_dir)
  path = next((os.path.join(d, spec.member) for d in dirs
               if os.path.isfile(os.path.join(d, spec.member))), None)
  if path is None:
    archive = next((os.path.join(d, spec.archive) for d in dirs
                    if os.path.isfile(os.path.join(d, spec.archive))), None)
    if archive is not None:
      path = _extract_member(archive, spec)
  if path is not None:
    vocab = _read_counts(kind, path)
  elif download_allowed(allow_download):
    so = tff.simulation.datasets.stackoverflow
    directory = resolve_cache_dir(cache_dir)
    if kind == 'word':
      vocab = list(so.load_word_counts(cache_dir=directory, vocab_size=size))
    else:
      vocab = list(so.load_tag_counts(cache_dir=directory))
  else:
    raise _missing(f'StackOverflow {kind} counts file', spec.member, dirs[0], spec.url,
                   f'unpack it (`tar xjf {spec.archive}`; the archive itself also works)',
                   also=f' (also searched: {", ".join(dirs[1:])})' if dirs[1:] else '')
  if not vocab:
    raise TaskError(f'the StackOverflow {kind} counts file {path} is empty')
  return vocab[:size]


# ------------------------------------------------------- shared task helpers


def load_clients(dataset: str, options) -> tuple[RawData, tff.simulation.datasets.ClientData]:
  """`dataset`'s splits and the training clients `options` select (`TaskOptions`:
  cache_dir, use_synthetic_data, num_clients, seed)."""
  raw = load(dataset, options.cache_dir, options.use_synthetic_data)
  return raw, select_clients(raw.train, options.num_clients, options.seed)


def baseline_task(name: str, raw: RawData, train: tff.simulation.datasets.ClientData,
                  model: str, preprocess_fn, model_fn, eval_preprocess_fn,
                  augment_fn=None, **info: Any) -> Task:
  """The `Task` of a TFF baseline's data: its training clients, the test
  clients' examples as one centralised test set, and `task_info`."""
  return Task(name=name, train_data=train, preprocess_fn=preprocess_fn,
              model_fn=model_fn,
              test_data=centralized_test_data(raw.test, eval_preprocess_fn),
              augment_fn=augment_fn, info=task_info(raw, train, model, **info))


def train_client_spec(batch_size: int) -> tff.simulation.baselines.ClientSpec:
  """One epoch, batch B, no shuffling (the trainer shuffles and repeats)."""
  return tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1)


def select_clients(train: tff.simulation.datasets.ClientData,
                   num_clients: Optional[int], seed: int
                   ) -> tff.simulation.datasets.ClientData:
  """All clients, or a seeded random subset of `num_clients` (sorted ids)."""
  ids = list(train.client_ids)
  if num_clients is None or num_clients == len(ids):
    return train
  if num_clients > len(ids):
    raise TaskError(f'num_clients={num_clients} but the data has only '
                    f'{len(ids)} training clients')
  chosen = np.random.RandomState(seed).choice(len(ids), num_clients,
                                              replace=False)
  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      sorted(ids[i] for i in chosen), train.serializable_dataset_fn)


def centralized_test_data(test: tff.simulation.datasets.ClientData,
                          eval_preprocess_fn) -> tf.data.Dataset:
  """All test clients' examples (in a fixed client order), preprocessed."""
  return eval_preprocess_fn(test.create_tf_dataset_from_all_clients(seed=0))


def task_info(raw: RawData, train: tff.simulation.datasets.ClientData,
              model: str, **extra: Any) -> dict[str, Any]:
  info = collections.OrderedDict(
      model=model,
      num_train_clients=len(train.client_ids),
      num_available_train_clients=len(raw.train.client_ids),
      source=raw.source,
      data_file=raw.data_file)
  info.update(extra)
  return dict(info)
