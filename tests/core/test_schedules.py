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


# K_0 d^t equal to an integer in exact arithmetic but a few ulps above it in float64.
EXACT_POINTS = [(100, 0.8, 2, 64), (100, 0.1, 2, 1), (100, 0.9, 2, 81), (10, 0.7, 2, 5),
                (1000, 0.9, 3, 729), (1000, 0.3, 3, 27), (100, 0.6, 2, 36)]


@pytest.mark.parametrize('k0,d,t,want', EXACT_POINTS)
def test_local_steps_at_exact_integers_host_and_graph(k0, d, t, want):
  k = schedules.LocalSteps(k0, d)
  assert k(t) == want
  assert int(k(tf.constant(t))) == want
  assert int(tf.function(k)(tf.constant(t, tf.int64))) == want


def test_local_steps_still_rounds_up_just_above_an_integer():
  # 64 * (1 + 1e-7) is genuinely above 64: 65 steps, in both paths.
  assert schedules.tolerant_ceil(64 * (1 + 1e-7)) == 65
  assert float(schedules.tolerant_ceil(tf.constant(64 * (1 + 1e-7), tf.float64))) == 65
  assert schedules.tolerant_ceil(64.00000000000001) == 64
  assert float(schedules.tolerant_ceil(tf.constant(64.00000000000001, tf.float64))) == 64


def test_local_steps_total_uses_the_same_ceiling():
  k = schedules.LocalSteps(100, 0.8)
  assert k.total(3) == 100 + 80 + 64
  assert k.total(30) == sum(k(t) for t in range(30))


def test_paper000_decay_k_total_is_4586_steps():
  k = schedules.LocalSteps(10, 0.995)
  assert k.total(3000) == 4586
  assert sum(k(t) for t in range(3000)) == 4586
  assert schedules.LocalSteps(10).total(3000) == 30000
  saving = 1 - k.total(3000) / schedules.LocalSteps(10).total(3000)
  assert saving == pytest.approx(0.8471, abs=1e-4)  # the paper's "84% fewer"


@pytest.mark.parametrize('k0,d', [(10, 0.995), (33, 0.999), (100, 0.9996), (7, 0.5),
                                  (100, 0.8), (1000, 0.9), (100, 0.1)])
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
