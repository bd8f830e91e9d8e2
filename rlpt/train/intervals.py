"""Confidence intervals for holdout accuracies and for the gain between two
evaluations of the same tasks.

    wilson(k=26, n=64)                          # Interval(0.406, 0.293, 0.530): 26 of 64 right
    paired_gain(after=[1, 1, 0, ...], before=[0, 1, 0, ...])  # Interval of mean(after) - mean(before)

`wilson` is the Wilson score interval of a binomial proportion (Wilson 1927): the
set of p whose score test |k/n - p| <= z sqrt(p (1-p) / n) does not reject, which
unlike the Wald interval stays inside [0, 1] and keeps its coverage at 0 or n
successes. `paired_gain` is Newcombe's hybrid score interval for the difference of
two proportions measured on the same items (Newcombe 1998, Statistics in Medicine
17:2635, method 10): it combines the two Wilson intervals with the correlation
phi of the paired outcomes, so that tasks both evaluations get right (or both
wrong) narrow the interval, as a paired design should. Both are 95 % intervals at
the default z = 1.96. Method 10's one degenerate case: two evaluations with no
discordant task (the same tasks right both times) get an interval as wide as
|(p - low) - (high - p)| of their common Wilson interval, zero at p = 0.5.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate and its interval, all fractions (0.25 = 25 %)."""

  estimate: float
  low: float
  high: float

  @property
  def half_width(self) -> float:
    return (self.high - self.low) / 2

  def to_dict(self) -> dict[str, float]:
    return {"estimate": self.estimate, "low": self.low, "high": self.high}

  def format(self, scale: float = 100.0, signed: bool = False) -> str:
    """'41.4 [29.3, 53.0]' (percent points by default); signed: '+3.1 [-1.2, 7.4]'."""
    f = "{:+.1f}" if signed else "{:.1f}"
    return (f"{f.format(scale * self.estimate)} "
            f"[{f.format(scale * self.low)}, {f.format(scale * self.high)}]")


def wilson(k: int, n: int, z: float = Z95) -> Interval:
  """The Wilson score interval of k successes in n trials.

  Raises:
    ValueError: n < 1 or k outside [0, n].
  """
  if n < 1 or not 0 <= k <= n:
    raise ValueError(f"wilson: need 0 <= k <= n and n >= 1, got k={k}, n={n}")
  p = k / n
  z2 = z * z
  center = (p + z2 / (2 * n)) / (1 + z2 / n)
  half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
  # At k = 0 (or n) the bound is 0 (or 1) exactly; rounding must not push it past p.
  low = 0.0 if k == 0 else max(0.0, center - half)
  high = 1.0 if k == n else min(1.0, center + half)
  return Interval(p, low, high)


def paired_gain(after: Sequence[float], before: Sequence[float], z: float = Z95) -> Interval:
  """Newcombe's interval (method 10) for mean(after) - mean(before), paired.

  Args:
    after, before: per-task outcomes (1 = right, 0 = wrong; anything >= 1 counts as
      right), the same tasks in the same order.

  Raises:
    ValueError: different lengths or no tasks.
  """
  x1 = np.asarray(after, dtype=np.float64) >= 1.0
  x2 = np.asarray(before, dtype=np.float64) >= 1.0
  if x1.shape != x2.shape or x1.ndim != 1 or x1.size == 0:
    raise ValueError(f"paired_gain: need two equal-length non-empty outcome lists, got "
                     f"{x1.shape} and {x2.shape}")
  n = int(x1.size)
  a = int(np.sum(x1 & x2))     # right both times
  b = int(np.sum(x1 & ~x2))    # right only after
  c = int(np.sum(~x1 & x2))    # right only before
  d = n - a - b - c            # wrong both times
  p1, p2 = (a + b) / n, (a + c) / n
  w1, w2 = wilson(a + b, n, z), wilson(a + c, n, z)
  margins = (a + b) * (c + d) * (a + c) * (b + d)
  phi = (a * d - b * c) / math.sqrt(margins) if margins > 0 else 0.0
  dl1, du1 = p1 - w1.low, w1.high - p1
  dl2, du2 = p2 - w2.low, w2.high - p2
  delta = math.sqrt(max(dl1 * dl1 - 2 * phi * dl1 * du2 + du2 * du2, 0.0))
  eps = math.sqrt(max(du1 * du1 - 2 * phi * du1 * dl2 + dl2 * dl2, 0.0))
  theta = p1 - p2
  return Interval(theta, max(-1.0, theta - delta), min(1.0, theta + eps))


def paired_gain_scored(after: Sequence[float | None], before: Sequence[float | None],
                       z: float = Z95) -> Interval | None:
  """`paired_gain` over the tasks scored in both lists (None = a task whose verifier
  failed, left unscored); None when the lists differ in length or no task is scored
  in both."""
  if len(after) != len(before):
    return None
  both = [(x, y) for x, y in zip(after, before) if x is not None and y is not None]
  if not both:
    return None
  return paired_gain([x for x, _ in both], [y for _, y in both], z)


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
  """(mean, sample standard deviation; 0 for one value) of per-seed figures."""
  v = np.asarray(values, dtype=np.float64)
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0
