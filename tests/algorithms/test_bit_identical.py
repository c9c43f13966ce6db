"""Every registered algorithm's model after 3 rounds on a fixed task, on the
in-process backend, is bit-identical to the recorded one.

The recording (`data/bit_identical_models.json`) was made before the round
plumbing, the hyperparameter sources and the trainer loop were restructured;
a refactor that changes any algorithm's arithmetic — an operation reordered,
a cast moved, a default drifting — changes a digest here. Re-record only for
a deliberate change of an algorithm's maths (`TFF_ALGOS_RECORD=1`: the new
digest and fingerprint replace the recorded ones), and say so in the commit.

The last bits depend on the CPU's kernels (TensorFlow picks its matrix and
reduction kernels by instruction set): fedrr, nastya, kmaml and mimelite came
out differently on an AMD EPYC (AVX-512) VM than on the machine of the
recording, deterministically and whatever the client concurrency. So each
algorithm keeps its digest per kind of CPU (`cpu_kind()`: model name and
AVX-512), and a fingerprint of the model (its norm, sum and 64 of its values):

* a digest recorded for any kind: passes;
* this CPU's kind recorded with another digest: fails (the code changed);
* this CPU's kind never recorded: the fingerprint must agree to 1e-5
  (relative, or of the values' scale near 0; kernels move the last bits,
  ~1e-7; a change of the maths mostly moves far more, but one below 1e-5 passes
  there),
  and a warning asks for `TFF_ALGOS_RECORD=add`, which adds this kind's
  digest; it is only for a tree whose algorithms are unchanged since the
  recording (the AMD digests were added from the recording's code).
"""

import dataclasses
import functools
import hashlib
import json
import os
import platform
import warnings

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

from paths import DATA
from tasks import TaskOptions, get_task
from tff_algos import runtime
from tff_algos.core import rounds, stateful_process
from tff_algos.algorithms import registry
from tff_algos.flags import algorithm_flags
from tff_algos.flags.algorithm_flags import HParams
from tff_algos import training

RECORD = os.path.join(DATA, 'bit_identical_models.json')
NUM_CLIENTS = 4
ROUNDS = 3


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='mlp'))


@pytest.fixture(scope='module')
def context():
  ctx = runtime.ManagedContext(backend='inprocess')
  yield ctx.context
  ctx.close()


def hparams(name: str) -> HParams:
  """Two local steps (one pass for the shuffling methods and FedSGD, which take no K),
  everything else the algorithm's own defaults."""
  one_pass = name in ('nastya', 'fedrr', 'fedsgd')  # they take no --local_steps
  hp = HParams() if one_pass else HParams(local_steps=2)
  unset = {f.name for f in dataclasses.fields(HParams)} - (set() if one_pass else {'local_steps'})
  return algorithm_flags.with_defaults(name, hp, unset)


def digest(weights) -> str:
  h = hashlib.sha256()
  for x in tf.nest.flatten(weights):
    a = np.ascontiguousarray(np.asarray(x))
    h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
  return h.hexdigest()


def final_model(name, task, context):
  algorithm = algorithm_flags.build(name, task.model_fn, hparams(name))
  process = algorithm.process
  data = [task.client_dataset(cid) for cid in task.client_ids[:NUM_CLIENTS]]
  with context_stack_impl.context_stack.install(context):
    if algorithm.stateful_clients:
      state = process.initialize(stateful_process.Population(20, 30.0))
    else:
      state = process.initialize()
    state = process.set_model_weights(state, training.initial_model_weights(task, seed=7))
    if algorithm.stateful_clients:
      client_states = [process.initial_client_state(state)] * len(data)
    for _ in range(ROUNDS):
      if algorithm.stateful_clients:
        out = process.next(state, data, client_states)
        client_states = out.client_states
      else:
        out = process.next(state, data)
      state = out.state
    weights = process.get_model_weights(state)
  return weights


FINGERPRINT_VALUES = 64
FINGERPRINT_RTOL = 1e-5
UNNAMED_KIND = 'the recording machine (kind not noted)'


@functools.lru_cache(maxsize=None)
def cpu_kind() -> str:
  """This CPU's model name, and whether it has AVX-512 (TensorFlow's kernels
  differ with it)."""
  info = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        info.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  name = info.get('model name') or platform.processor() or platform.machine()
  avx512 = 'avx512f' in info.get('flags', '').split()
  return f'{name}, {"AVX-512" if avx512 else "no AVX-512"}'


def fingerprint(weights) -> list[float]:
  """The model's L2 norm and sum (float64), then 64 of its values spread over
  all weights."""
  flat = np.concatenate([np.asarray(x, np.float64).ravel() for x in tf.nest.flatten(weights)])
  picks = np.linspace(0, flat.size - 1, FINGERPRINT_VALUES).round().astype(int)
  return [float(np.linalg.norm(flat)), float(flat.sum())] + flat[picks].tolist()


def load_record() -> dict:
  with open(RECORD) as f:
    return json.load(f)


def test_every_algorithm_is_recorded():
  record = load_record()
  assert sorted(record) == sorted(registry.ALGORITHMS)
  for name, entry in record.items():
    assert entry['digests'] and len(entry['fingerprint']) == 2 + FINGERPRINT_VALUES, name


def test_cpu_kind_names_the_model_and_avx512():
  assert cpu_kind().endswith(('AVX-512', 'no AVX-512')) and len(cpu_kind()) > len('no AVX-512')


@pytest.mark.parametrize('name', sorted(registry.ALGORITHMS))
def test_model_after_three_rounds_is_bit_identical(name, task, context):
  fallbacks = len(rounds.autograph_fallbacks)
  weights = final_model(name, task, context).trainable
  # Its client code traced without AutoGraph (`rounds.run_client`).
  assert rounds.autograph_fallbacks[fallbacks:] == [], name
  got, kind = digest(weights), cpu_kind()
  mode = os.environ.get('TFF_ALGOS_RECORD')
  if mode:
    record = load_record() if os.path.exists(RECORD) else {}
    entry = record.get(name) if mode == 'add' else None
    if entry is None:
      entry = dict(digests={})
    entry['digests'][kind] = got
    if not entry.get('fingerprint'):
      entry['fingerprint'] = fingerprint(weights)
    record[name] = entry
    with open(RECORD, 'w') as f:
      json.dump(record, f, indent=1, sort_keys=True)
    return
  check(name, weights, load_record()[name], kind)


def check(name: str, weights, entry: dict, kind: str) -> None:
  """Passes, fails or warns for `weights` against `entry` on CPU `kind` (the
  module docstring's three cases)."""
  got, digests = digest(weights), entry['digests']
  if got in digests.values():
    return
  assert kind not in digests, (
      f'{name}: model after {ROUNDS} rounds changed on this kind of CPU ({kind}): '
      f'{got}, recorded {digests[kind]}')
  recorded = np.asarray(entry['fingerprint'])
  scale = np.sqrt(np.mean(recorded[2:] ** 2))  # values near 0 get this scale's tolerance
  np.testing.assert_allclose(
      fingerprint(weights), recorded, rtol=FINGERPRINT_RTOL, atol=FINGERPRINT_RTOL * scale,
      err_msg=f'{name}: model after {ROUNDS} rounds changed (fingerprint; this CPU kind, '
      f'{kind}, has no recorded digest)')
  warnings.warn(f'{name}: no digest recorded for this CPU kind ({kind}); the model agrees '
                f'with the recorded fingerprint to {FINGERPRINT_RTOL:g}. On unchanged '
                'algorithms, TFF_ALGOS_RECORD=add records this kind\'s digest.')


def test_an_unseen_cpu_kind_is_checked_against_the_fingerprint():
  rng = np.random.default_rng(0)
  weights = [rng.normal(size=(64, 10)).astype(np.float32), rng.normal(size=10).astype(np.float32)]
  entry = dict(digests={'Kind A, AVX-512': digest(weights)}, fingerprint=fingerprint(weights))
  check('x', weights, entry, 'Kind A, AVX-512')  # its own digest
  check('x', weights, entry, 'Kind B, no AVX-512')  # a digest of another kind
  # Last bits moved (as by other kernels): a new kind passes with a warning,
  # the recorded kind fails.
  moved = [np.nextafter(w, np.inf, dtype=np.float32) for w in weights]
  with pytest.warns(UserWarning, match='no digest recorded for this CPU kind'):
    check('x', moved, entry, 'Kind B, no AVX-512')
  with pytest.raises(AssertionError, match='changed on this kind of CPU'):
    check('x', moved, entry, 'Kind A, AVX-512')
  # A change of the maths fails on a new kind too.
  changed = [weights[0] * np.float32(1.001), weights[1]]
  with pytest.raises(AssertionError, match='fingerprint'):
    check('x', changed, entry, 'Kind B, no AVX-512')
