"""Round-indexed schedules: formulas, host/graph agreement, paper-000 totals."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_algos.core import schedules


def test_local_steps_formula_and_floor():
  k = schedules.LocalSteps(10, 0.9)
  assert [k(t) for t in range(4)] == [10, 9, 9, 8]  # ceil(10*.9^t): 10, 9, 8.1, 7.29
  assert k(1000) == 1
  assert schedules.LocalSteps(33)(500) == 33


def test_paper000_decay_k_total_is_4586_steps():
  k = schedules.LocalSteps(10, 0.995)
  assert k.total(3000) == 4586
  assert sum(k(t) for t in range(3000)) == 4586
  assert schedules.LocalSteps(10).total(3000) == 30000
  saving = 1 - k.total(3000) / schedules.LocalSteps(10).total(3000)
  assert saving == pytest.approx(0.8471, abs=1e-4)  # the paper's "84% fewer"


@pytest.mark.parametrize('k0,d', [(10, 0.995), (33, 0.999), (100, 0.9996), (7, 0.5)])
def test_graph_and_host_agree_on_every_round(k0, d):
  k = schedules.LocalSteps(k0, d)
  t = tf.range(0, 6000)
  graph = tf.vectorized_map(lambda r: k(r), t).numpy()
  host = np.array([k(int(r)) for r in range(6000)])
  np.testing.assert_array_equal(graph, host)


def test_exponential_decay_graph_and_host():
  s = schedules.ExponentialDecay(0.1, 0.995)
  assert s(0) == 0.1
  assert s(100) == pytest.approx(0.1 * 0.995 ** 100)
  assert float(s(tf.constant(100))) == pytest.approx(0.1 * 0.995 ** 100, rel=1e-6)
  assert schedules.ExponentialDecay(0.3).constant


@pytest.mark.parametrize('bad', [dict(initial=0), dict(initial=2.5), dict(initial=3, decay=0.0),
                                 dict(initial=3, decay=1.5)])
def test_bad_local_steps_rejected(bad):
  with pytest.raises(ValueError):
    schedules.LocalSteps(**bad)


def test_bad_decay_rejected():
  with pytest.raises(ValueError):
    schedules.ExponentialDecay(0.1, -0.1)
  with pytest.raises(ValueError):
    schedules.ExponentialDecay(-1.0)
