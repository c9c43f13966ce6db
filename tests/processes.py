"""Driving a TFF learning process in tests: rounds from given weights, the
trainable weights it ends with, a training run crashed and resumed, and the
small run the round-loop tests share."""

import numpy as np
import pytest

from tasks import TaskOptions, get_task
from tff_algos.algorithms import fedopt
from tff_algos.core import optimizers
from tff_algos import training


def digits_task():
  """12 clients of the digits task with its logistic model, batches of 16."""
  return get_task('digits', TaskOptions(batch_size=16, num_clients=12, model='logistic'))


def fedavg_with_schedule(task):
  """FedAvg with 3 local steps decaying by 0.8 and an Adam server."""
  return fedopt.build_fedopt(task.model_fn, fedopt.FedOptConfig(client_learning_rate=0.1, local_steps=3, local_steps_decay=0.8, server_optimizer='adam', server_learning_rate=0.02))


def run_rounds(process, weights, data, rounds):
  """`rounds` rounds of `process` on the same client datasets, starting from
  `weights` (`ModelWeights`); returns (final state, each round's output)."""
  state = process.set_model_weights(process.initialize(), weights)
  outputs = []
  for _ in range(rounds):
    out = process.next(state, data)
    state = out.state
    outputs.append(out)
  return state, outputs


def trainable(process, state):
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


class Crash(Exception):
  """A run stopped by `run_crashed_then_resumed` after a given round."""


def run_crashed_then_resumed(algorithm, task, config, crash_after: int):
  """`training.run_training` of `config` stopped by an exception right after
  round `crash_after` (its outputs written), then the same run again: the
  resumed run's result."""
  def crash(done, state, row):
    del state, row
    if done == crash_after:
      raise Crash()

  with pytest.raises(Crash):
    training.run_training(algorithm, task, config, round_callback=crash)
  return training.run_training(algorithm, task, config)
