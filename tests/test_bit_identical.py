"""Every registered algorithm's model after 3 rounds on a fixed task, on the
in-process backend, is bit-identical to the recorded one.

The recording (`data/bit_identical_models.json`) was made before the round
plumbing, the hyperparameter sources and the trainer loop were restructured;
a refactor that changes any algorithm's arithmetic — an operation reordered,
a cast moved, a default drifting — changes a digest here. Re-record only for
a deliberate change of an algorithm's maths (`TFF_ALGOS_RECORD=1`: the new
digest replaces the recorded ones), and say so in the commit.

The last bits depend on the CPU's kernels (TensorFlow picks its matrix and
reduction kernels by instruction set): fedrr, nastya, kmaml and mimelite came
out differently on an AMD EPYC (AVX-512) VM than on the machine of the
recording, deterministically and whatever the client concurrency. Each
algorithm therefore lists the digests of the same code on each kind of machine
seen; `TFF_ALGOS_RECORD=add` adds this machine's digest to the list, and is
only for a tree whose algorithms are unchanged since the recording (it was run
on the code of the recording, with this machine's failures checked to be its
kernels, not a change).
"""

import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

from tasks import TaskOptions, get_task
from tff_algos import registry, runtime, training
from tff_algos.core import stateful_process
from tff_algos.hparams import HParams

RECORD = os.path.join(os.path.dirname(__file__), 'data', 'bit_identical_models.json')
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
  """Two local steps (one pass for the shuffling methods, which take no K),
  everything else the algorithm's own defaults."""
  one_pass = name in ('nastya', 'fedrr')
  hp = HParams() if one_pass else HParams(local_steps=2)
  unset = {f.name for f in dataclasses.fields(HParams)} - (set() if one_pass else {'local_steps'})
  return registry.with_defaults(name, hp, unset)


def digest(weights) -> str:
  h = hashlib.sha256()
  for x in tf.nest.flatten(weights):
    a = np.ascontiguousarray(np.asarray(x))
    h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
  return h.hexdigest()


def final_model(name, task, context):
  algorithm = registry.build(name, task.model_fn, hparams(name))
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


def test_every_algorithm_is_recorded():
  with open(RECORD) as f:
    assert sorted(json.load(f)) == sorted(registry.ALGORITHMS)


@pytest.mark.parametrize('name', sorted(registry.ALGORITHMS))
def test_model_after_three_rounds_is_bit_identical(name, task, context):
  weights = final_model(name, task, context)
  got = digest(weights.trainable)
  mode = os.environ.get('TFF_ALGOS_RECORD')
  if mode:
    record = json.load(open(RECORD)) if os.path.exists(RECORD) else {}
    known = record.get(name, []) if mode == 'add' else []
    record[name] = known + ([] if got in known else [got])
    with open(RECORD, 'w') as f:
      json.dump(record, f, indent=1, sort_keys=True)
    return
  with open(RECORD) as f:
    known = json.load(f)[name]
  assert got in known, f'{name}: model after {ROUNDS} rounds changed ({got} not in {known})'
