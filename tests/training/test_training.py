"""The round loop: determinism, checkpoint/resume, outputs."""

import csv
import dataclasses
import json
import os

import numpy as np
import pytest

from processes import run_crashed_then_resumed
import processes
from tff_algos.errors import UserError
from tff_algos.training import initial_weights, sampling, loop as training


@pytest.fixture(scope='module')
def task():
  return processes.digits_task()


@pytest.fixture(scope='module')
def algorithm(task):
  return processes.fedavg_with_schedule(task)


def config(out_dir, rounds=6, seed=0):
  return training.RunConfig(total_rounds=rounds, clients_per_round=4, seed=seed,
                            rounds_per_eval=3, rounds_per_checkpoint=2,
                            output_dir=out_dir, progress=False)


def weights(result):
  return [np.asarray(w) for w in result.model_weights.trainable]


def tensorboard_steps(tb_dir, tag) -> dict[int, float]:
  """step -> value of scalar `tag` over all event files; a repeated step fails."""
  import glob
  import tensorflow as tf
  steps = {}
  for path in glob.glob(os.path.join(tb_dir, '**', 'events.*'), recursive=True):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          assert event.step not in steps, f'step {event.step} of {tag} logged twice'
          steps[event.step] = float(tf.make_ndarray(value.tensor))
  return steps


def test_same_seed_same_result_other_seed_differs(task, algorithm):
  a = weights(training.run_training(algorithm, task, config(None)))
  b = weights(training.run_training(algorithm, task, config(None)))
  c = weights(training.run_training(algorithm, task, config(None, seed=1)))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert max(np.abs(x - y).max() for x, y in zip(a, c)) > 1e-4


def test_a_swallowed_sigint_stops_the_run_before_the_next_round(task, algorithm, tmp_path,
                                                               monkeypatch):
  # The SIGINT handler stops the workers, then raises KeyboardInterrupt; Python
  # swallows it if it lands in e.g. a weakref callback. The flag the handler
  # leaves must still end the run between rounds, after the round in flight.
  from tff_algos.runtime import context

  def sigint_during_3(done, state, row):
    if done == 3:
      monkeypatch.setattr(context, '_interrupted', 2)

  out = str(tmp_path / 'interrupted')
  with pytest.raises(KeyboardInterrupt):
    training.run_training(algorithm, task, config(out), round_callback=sigint_during_3)
  with open(os.path.join(out, 'metrics.csv')) as f:
    assert [int(float(r['round'])) for r in csv.DictReader(f)] == [1, 2, 3]
  # The next run (a sweep's) does not start.
  with pytest.raises(KeyboardInterrupt, match='install'):
    training.run_training(algorithm, task, config(None))


def test_a_round_cut_by_a_swallowed_signal_ends_in_keyboard_interrupt(task, algorithm,
                                                                     monkeypatch):
  # The signal stopped the workers mid-round: the round's call fails with
  # WorkerStopped, which the run reports as the interrupt it was.
  from tff_algos import runtime
  from tff_algos.runtime import context

  class StoppedMidRound:
    def __init__(self, process, signalled):
      self._process, self._signalled = process, signalled

    def __getattr__(self, name):
      return getattr(self._process, name)

    def next(self, *args):
      if self._signalled:
        monkeypatch.setattr(context, '_interrupted', 2)
      raise runtime.WorkerStopped('stopped')

  cut = dataclasses.replace(algorithm, process=StoppedMidRound(algorithm.process, True))
  with pytest.raises(KeyboardInterrupt):
    training.run_training(cut, task, config(None))
  monkeypatch.setattr(context, '_interrupted', None)
  crashed = dataclasses.replace(algorithm, process=StoppedMidRound(algorithm.process, False))
  with pytest.raises(runtime.WorkerStopped):  # no signal (a worker died): the error itself
    training.run_training(crashed, task, config(None))


def test_interrupted_run_resumes_to_the_same_model(task, algorithm, tmp_path):
  full = training.run_training(algorithm, task, config(str(tmp_path / 'full')))

  out = str(tmp_path / 'crashed')
  resumed = run_crashed_then_resumed(algorithm, task, config(out), crash_after=6)
  assert resumed.resumed_from == 4  # the last checkpoint before the crash
  for x, y in zip(weights(full), weights(resumed)):
    np.testing.assert_array_equal(x, y)
  with open(os.path.join(out, 'metrics.csv')) as f:
    rounds = [int(float(r['round'])) for r in csv.DictReader(f)]
  assert rounds == [1, 2, 3, 4, 5, 6]
  with open(os.path.join(tmp_path / 'full', 'metrics.csv')) as f:
    full_rows = list(csv.DictReader(f))
  with open(os.path.join(out, 'metrics.csv')) as f:
    resumed_rows = list(csv.DictReader(f))
  for a, b in zip(full_rows, resumed_rows):
    assert a['client_work/train/loss'] == b['client_work/train/loss']
  # TensorBoard: each round once. Round 5 ran (and was logged) twice: before
  # the crash in round 6's callback, and after the resume from round 4.
  steps = tensorboard_steps(os.path.join(out, 'tb'), 'client_work/train/loss')
  assert sorted(steps) == [1, 2, 3, 4, 5, 6]
  assert steps[5] == pytest.approx(float(resumed_rows[4]['client_work/train/loss']))
  summary = json.load(open(os.path.join(out, 'summary.json')))
  # Totals cover the whole run, not just the resumed part: K_t = 3, 3, 2, 2, 2, 1.
  assert summary['totals']['client_steps'] == 4 * (3 + 3 + 2 + 2 + 2 + 1)
  assert summary['resumed_from'] == 4
  saved = np.load(os.path.join(out, 'final_weights.npz'))
  np.testing.assert_array_equal(saved['arr_0'], weights(full)[0])


def test_metrics_rows_carry_cost_and_eval(task, algorithm, tmp_path):
  result = training.run_training(algorithm, task, config(str(tmp_path)))
  rows = result.history
  assert len(rows) == 6
  assert all(r['download_bytes'] == 4 * algorithm.traffic.download_bytes for r in rows)
  assert all(r['upload_bytes'] == 4 * algorithm.traffic.upload_bytes for r in rows)
  assert all(r['round_time_s'] > 0 for r in rows)
  assert [r['round'] for r in rows if 'eval/loss' in r] == [3, 6]
  assert 0.0 <= result.final_eval['sparse_categorical_accuracy'] <= 1.0
  assert os.path.isdir(tmp_path / 'tb')


def test_bad_run_config_rejected():
  with pytest.raises(ValueError, match='total_rounds'):
    training.RunConfig(total_rounds=-1, clients_per_round=2)
  with pytest.raises(ValueError, match='clients_per_round'):
    training.RunConfig(total_rounds=1, clients_per_round=0)


def test_too_many_clients_per_round_rejected(task, algorithm):
  with pytest.raises(ValueError, match='exceeds'):
    training.run_training(algorithm, task, training.RunConfig(
        total_rounds=1, clients_per_round=13, progress=False))


def test_sampling_is_without_replacement_and_seeded():
  ids = [str(i) for i in range(50)]
  a = sampling.sample_clients(ids, 10, seed=3, round_num=7)
  assert len(set(a)) == 10
  assert a == sampling.sample_clients(ids, 10, seed=3, round_num=7)
  assert a != sampling.sample_clients(ids, 10, seed=3, round_num=8)


def test_periodic_eval_can_use_a_fixed_sample_and_final_eval_uses_all(task, algorithm):
  result = training.run_training(algorithm, task, training.RunConfig(
      total_rounds=4, clients_per_round=4, rounds_per_eval=2, max_eval_examples=50,
      progress=False))
  evals = [r for r in result.history if 'eval/num_examples' in r]
  assert [r['round'] for r in evals] == [2, 4]
  assert evals[0]['eval/num_examples'] == 50
  assert evals[1]['eval/num_examples'] == 359  # the whole digits test set


def test_resume_with_different_settings_is_refused(task, algorithm, tmp_path):
  out = str(tmp_path / 'run')
  training.run_training(algorithm, task, config(out, rounds=2), identity={'lr': 0.1})
  # Same identity, more rounds: resumes.
  assert training.run_training(algorithm, task, config(out, rounds=3),
                               identity={'lr': 0.1}).resumed_from == 2
  with pytest.raises(UserError, match=r'differs in: lr \(0.1 there, 0.2 here\)'):
    training.run_training(algorithm, task, config(out, rounds=4), identity={'lr': 0.2})
  with pytest.raises(UserError, match='differs in: seed'):
    training.run_training(algorithm, task, config(out, rounds=4, seed=5), identity={'lr': 0.1})


def test_initial_weights_are_drawn_once_per_model_and_seed(task, monkeypatch):
  """Re-seeding TensorFlow clears its kernel cache (every function of the next
  round instantiated again), so runs of one seed in a row draw the weights
  once: a later call gives the same weights and leaves Python's, numpy's and
  TensorFlow's seeds as the draw did. Another seed in between, or a seeded
  stateful random op imported, re-seeds and draws again."""
  import random
  import tensorflow as tf
  from tensorflow.python.eager import context
  from tff_algos.runtime.inprocess import graph_import
  monkeypatch.setattr(initial_weights, '_INITIAL_WEIGHTS', {})
  # (Earlier tests of this process may have imported a seeded random op.)
  monkeypatch.setattr(graph_import, 'seeded_random_imported', False)
  seeds = []
  real = tf.keras.utils.set_random_seed
  monkeypatch.setattr(tf.keras.utils, 'set_random_seed', lambda s: (seeds.append(s), real(s)))

  def draw(seed):
    w = training.initial_model_weights(task, seed)
    shuffled = list(tf.data.Dataset.range(8).shuffle(8, seed=7).as_numpy_iterator())
    return list(w.trainable), (random.random(), np.random.random(), shuffled)

  first, after_first = draw(3)
  drawn = [np.array(a) for a in first]
  first[0] += 1.0  # a caller's change does not reach the kept weights
  kept, after_kept = draw(3)
  assert seeds == [3] and context.global_seed() == 3
  assert after_kept == after_first
  for a, b in zip(kept, drawn):
    np.testing.assert_array_equal(a, b)
  other, after_other = draw(4)
  assert not np.array_equal(other[0], drawn[0]) and after_other[2] != after_first[2]
  again, after_again = draw(3)  # the global seed is 4's: drawn again
  assert seeds == [3, 4, 3] and after_again == after_first
  for a, b in zip(again, drawn):
    np.testing.assert_array_equal(a, b)
  monkeypatch.setattr(graph_import, 'seeded_random_imported', True)
  draw(3)
  assert seeds == [3, 4, 3, 3]


def test_a_progress_bar_on_a_closed_pipe_still_lets_the_outputs_close():
  """`train ... 2>&1 | head`: tqdm's close raises on the closed pipe; the
  run's outputs (rows not yet written, TensorBoard, the client store) close
  anyway."""
  closed = []

  class Bar:
    def close(self):
      raise BrokenPipeError(32, 'Broken pipe')

  class Outputs:
    def close(self):
      closed.append(True)

  loop = training._RoundLoop.__new__(training._RoundLoop)  # pylint: disable=protected-access
  loop.bar, loop.outputs = Bar(), Outputs()
  loop._close()  # pylint: disable=protected-access
  assert closed == [True]


def test_a_different_run_says_what_differs_with_both_values():
  """'differs in: task_info, traffic' (a changed model) named two internal
  entries and no value; now the differing keys inside them, with both values."""
  from tff_algos.training import outputs as run_outputs
  said = run_outputs._identity_diff(  # pylint: disable=protected-access
      dict(seed=0, task_info=dict(model='cnn', clients=10), lr=0.1),
      dict(seed=0, task_info=dict(model='cnn_dropout', clients=10)))
  assert said == ("lr (0.1 there, the default here), "
                  "task_info.model ('cnn' there, 'cnn_dropout' here)")
  assert run_outputs._identity_diff(dict(a=1), dict(a=1)) == ''  # pylint: disable=protected-access
  many = run_outputs._identity_diff({k: 1 for k in 'abcdef'}, {k: 2 for k in 'abcdef'})  # pylint: disable=protected-access
  assert many.endswith('d (1 there, 2 here), 2 more')
