"""Summaries over seeds: mean, standard deviation and a 95 % confidence interval.

A published number is one value; ours is a sample of seeds. `summarize` gives
the sample mean, its standard deviation (n − 1 in the denominator) and the
two-sided 95 % Student-t interval for the mean, mean ± t_{0.975, n−1}·s/√n.
With one seed there is no spread: std and the interval are None, and a report
says so instead of claiming agreement.

Curves (accuracy against round) are averaged over seeds first, as the papers
plot and report them: "max accuracy" is the maximum of the seed-averaged
curve. Its spread is that of the per-seed values at the round where the
averaged curve peaks, whose mean is exactly the reported maximum
(`peak_of_mean_curve`).

    python -m experiments.seed_stats --values=0.81,0.83,0.80 --published=0.82

prints n, mean, std, the 95 % interval and whether the published value lies
inside it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


def t_quantile_975(dof: int) -> float:
  from scipy import stats
  return float(stats.t.ppf(0.975, dof))


def summarize(values: Sequence[Optional[float]]) -> dict:
  """Mean, std, 95 % CI over the non-missing values; `missing` counts the Nones.

  A None is a seed that did not produce the quantity (e.g. never reached a
  target); it is left out of the statistics and counted, never read as 0.
  """
  per_seed = [None if v is None else float(v) for v in values]
  present = [v for v in per_seed if v is not None and not math.isnan(v)]
  n = len(present)
  out = dict(n=n, missing=len(per_seed) - n, per_seed=per_seed,
             mean=None, std=None, ci95=None)
  if n == 0:
    return out
  mean = float(np.mean(present))
  out['mean'] = mean
  if n >= 2:
    std = float(np.std(present, ddof=1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    out.update(std=std, ci95=[mean - half, mean + half])
  return out


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
  """The seed-averaged curve over the rounds that every seed evaluated."""
  if not curves:
    return []
  by_seed = [dict(c) for c in curves]
  common = sorted(set.intersection(*(set(d) for d in by_seed)))
  return [(r, float(np.mean([d[r] for d in by_seed]))) for r in common]


def peak_of_mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> Optional[dict]:
  """Max of the seed-averaged curve, with the per-seed values at its round.

  Returns `summarize` of those values (their mean is the maximum) plus
  `round` (where the averaged curve peaks) and `per_seed_max` (each seed's
  own maximum, for reference), or None when no round is common to all seeds.
  """
  averaged = mean_curve(curves)
  if not averaged:
    return None
  peak_round, _ = max(averaged, key=lambda rv: rv[1])
  stats = summarize([dict(c)[peak_round] for c in curves])
  stats.update(round=peak_round,
               per_seed_max=[max(v for _, v in c) for c in curves])
  return stats


def contains(stats: Optional[dict], value: float) -> Optional[bool]:
  """Whether `value` lies in the 95 % interval; None when there is none (one seed)."""
  if not stats or stats.get('ci95') is None:
    return None
  lo, hi = stats['ci95']
  return lo <= value <= hi



def describe(values: Sequence[float], published: Optional[float] = None) -> str:
  """One line: n, mean, std, the 95 % interval and, given `published`,
  whether it lies inside."""
  s = summarize(values)
  line = f"n={s['n']} mean={s['mean']:.6g}"
  if s['std'] is None:
    line += ' std=none ci95=none (one value: no spread)'
  else:
    line += f" std={s['std']:.6g} ci95=[{s['ci95'][0]:.6g}, {s['ci95'][1]:.6g}]"
  if published is not None:
    inside = contains(s, published)
    line += f' published={published:.6g} ' + (
        'inside=unknown (one value)' if inside is None else f'inside={"yes" if inside else "no"}')
  return line



def define_flags() -> None:
  """The binary's flags: defined when it runs, not when the other binaries import it."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_list('values', [], 'Per-seed values, comma-separated, e.g. 0.81,0.83,0.80.')
  flags.DEFINE_float('published', None, 'A published value: is it inside the 95 % interval?')


def main(argv) -> int:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments.lib import common  # pylint: disable=g-import-not-at-top
  from experiments.configs import number_list  # pylint: disable=g-import-not-at-top
  values = number_list('values', flags.FLAGS.values, example='0.81,0.83,0.80')
  published = flags.FLAGS.published
  if published is not None and not math.isfinite(published):
    return common.fail(f'--published must be a finite number, got {published}')
  print(describe(values, published))
  return 0


if __name__ == '__main__':
  from experiments.lib import common  # pylint: disable=g-import-not-at-top
  define_flags()
  common.run(main)
