"""The holdout interval arithmetic against hand-computed values, and its coverage."""

import json

import numpy as np
import pytest

from rlpt.train import intervals, metrics, seed_summary


def test_wilson_matches_hand_computed_values():
  # 5 of 10: center = (0.5 + z^2/20) / (1 + z^2/10) = 0.5; half = z/(1 + z^2/10) *
  # sqrt(0.025 + z^2/400) = 1.41600 * 0.18605 = 0.26341.
  np.testing.assert_allclose([intervals.wilson(5, 10).low, intervals.wilson(5, 10).high],
                             [0.23659, 0.76341], atol=1e-5)
  # 0 of 10: the lower bound is 0, the upper 2 * 0.19207 / 1.38415 = 0.27753.
  w = intervals.wilson(0, 10)
  assert w.low == 0.0 and w.estimate == 0.0
  np.testing.assert_allclose(w.high, 0.27753, atol=1e-5)
  w = intervals.wilson(10, 10)
  assert w.high == 1.0
  np.testing.assert_allclose(w.low, 1 - 0.27753, atol=1e-5)
  # 26 of 64: center 0.436262 / 1.060023 = 0.411559, half 1.849017 * 0.063272 = 0.116990.
  w = intervals.wilson(26, 64)
  np.testing.assert_allclose([w.estimate, w.low, w.high], [0.40625, 0.29457, 0.52855],
                             atol=1e-5)
  assert w.format() == "40.6 [29.5, 52.9]"
  with pytest.raises(ValueError, match="k=11, n=10"):
    intervals.wilson(11, 10)


def test_paired_gain_matches_hand_computed_values():
  # a=0 b=5 c=0 d=5: a margin is 0 so phi = 0; delta = sqrt(0.26341^2 + 0.27753^2) =
  # 0.38263 below 0.5; eps = 0.26341 above it.
  g = intervals.paired_gain([1] * 5 + [0] * 5, [0] * 10)
  np.testing.assert_allclose([g.estimate, g.low, g.high], [0.5, 0.11737, 0.76341], atol=1e-5)
  # a=3 b=2 c=1 d=4: p1 = 0.5 (Wilson 0.23659-0.76341), p2 = 0.4 (0.16818-0.68732),
  # phi = (12 - 2) / sqrt(5*5*4*6) = 0.408248;
  # delta = sqrt(0.26341^2 - 2 phi 0.26341 0.28732 + 0.28732^2) = 0.30025,
  # eps = sqrt(0.26341^2 - 2 phi 0.26341 0.23182 + 0.23182^2) = 0.27069.
  after = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
  before = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
  g = intervals.paired_gain(after, before)
  np.testing.assert_allclose([g.estimate, g.low, g.high], [0.1, -0.20025, 0.37069], atol=1e-4)
  assert g.format(signed=True) == "+10.0 [-20.0, +37.1]"
  # Identical evaluations (phi = 1, no discordant pairs): method 10's known degenerate
  # case, width |dl - du| of the Wilson interval, 0 at p = 0.5 (documented in the module).
  same = intervals.paired_gain(after, after)
  assert same.estimate == 0.0 and same.low == same.high == 0.0
  with pytest.raises(ValueError, match="equal-length"):
    intervals.paired_gain([1, 0], [1])


def test_paired_gain_is_narrower_than_independent_and_covers():
  rng = np.random.default_rng(0)
  # Cells (both right, after only, before only, both wrong): p_after 0.5, p_before 0.4.
  probs, n, sims = [0.3, 0.2, 0.1, 0.4], 200, 2000
  covered, widths = 0, []
  for _ in range(sims):
    cell = rng.choice(4, size=n, p=probs)
    after, before = np.isin(cell, [0, 1]), np.isin(cell, [0, 2])
    g = intervals.paired_gain(after, before)
    covered += g.low <= 0.1 <= g.high
    widths.append(g.high - g.low)
  assert 0.93 <= covered / sims <= 0.97, covered / sims
  # An unpaired (independent Wilson) interval for the same data is wider.
  w1, w2 = intervals.wilson(100, n), intervals.wilson(80, n)
  unpaired = 2 * np.hypot(w1.half_width, w2.half_width)
  assert np.mean(widths) < 0.8 * unpaired


def test_learning_verdict():
  flat = [0.3, 0.35, 0.25, 0.3] * 5
  v = metrics.learning_verdict(flat)
  assert not v.learning and v.steps == 20 and "NOT LEARNING" in v.describe()
  rising = list(np.linspace(0.2, 0.6, 20) + np.tile([0.02, -0.02], 10))
  v = metrics.learning_verdict(rising)
  assert v.learning and v.describe().startswith("yes")
  np.testing.assert_allclose(v.first, np.mean(rising[:4]))
  np.testing.assert_allclose(v.last, np.mean(rising[-4:]))
  # The rise is the least-squares slope x 19 steps; its band from the residuals.
  slope, icpt = np.polyfit(np.arange(20), rising, 1)
  resid = np.asarray(rising) - (slope * np.arange(20) + icpt)
  se = np.sqrt(resid @ resid / 18 / np.sum((np.arange(20) - 9.5) ** 2))
  np.testing.assert_allclose([v.rise, v.noise], [19 * slope, 1.96 * 19 * se], rtol=1e-10)
  # Hand-computed: ten steps at 0 then 1 at the last: t = -4.5..4.5, sum t^2 = 82.5,
  # slope = 4.5 / 82.5, rise = 9 x slope = 0.4909.
  np.testing.assert_allclose(metrics.learning_verdict([0.0] * 9 + [1.0]).rise,
                             9 * 4.5 / 82.5, rtol=1e-12)
  assert metrics.learning_verdict([0.1] * 9) is None
  rows = [{"step": i + 1, "reward_mean": r, "time/step_s": 1.0} for i, r in enumerate(flat)]
  assert dict(metrics.summarize_run(rows))["learning"].startswith("NOT LEARNING")
  # Seed 1 of the default experiment (docs/benchmarks.md, issue 26, attempt M): +12 to
  # +26 holdout points; its fifths (3 steps) are within their noise, the line is not.
  seed1 = [0.125, 0.119, 0.285, 0.222, 0.129, 0.179, 0.234, 0.167, 0.122, 0.241, 0.234,
           0.14, 0.37, 0.339, 0.279, 0.246]
  v = metrics.learning_verdict(seed1)
  assert v.learning, v.describe()
  np.testing.assert_allclose([v.rise, v.noise], [0.1360, 0.1092], atol=1e-3)


def _evals(path, start, final):
  doc = {"0": {"stage": "after SFT", "domains": {}}, "30": {"stage": "step 30", "domains": {}}}
  for step, outcomes in (("0", start), ("30", final)):
    for d, c in outcomes.items():
      doc[step]["domains"][d] = {"accuracy": float(np.mean(c)), "n": len(c), "correct": c}
  path.mkdir()
  (path / "evals.json").write_text(json.dumps(doc))


def test_seed_summary_table(tmp_path):
  _evals(tmp_path / "seed_0", {"a": [0] * 10}, {"a": [1] * 5 + [0] * 5})
  _evals(tmp_path / "seed_1", {"a": [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]},
         {"a": [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]})
  header, rows, report = seed_summary.summarize(
      [str(tmp_path / "seed_0"), str(tmp_path / "seed_1")], ["s0", "s1"])
  assert header[-2:] == ["gain mean +- sd", "seeds with gain > 0 (95 %)"]
  assert rows[0][1] == "0.0 -> 50.0, +50.0 [+11.7, +76.3]"
  assert rows[0][-2] == f"+30.0 +- {100 * np.std([0.5, 0.1], ddof=1):.1f}"
  assert rows[0][-1] == "1 of 2"
  np.testing.assert_allclose(report["a"]["gain_mean"], 0.3)
  with pytest.raises(ValueError, match="no evals.json"):
    seed_summary.summarize([str(tmp_path / "missing")])
