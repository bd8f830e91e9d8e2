"""rlpt.research: a run read back from its files, and the report's arithmetic."""

import json
import math

import numpy as np
import pytest

from rlpt.research import report, runs


def _write_run(d, rewards, *, kl=0.0, evals=None, result=None, failure=None, resumed_at=None):
  d.mkdir(parents=True)
  lines = [{"step": i + 1, "reward_mean": r, "clip_frac": 0.1 * (i + 1), "kl": kl,
            "entropy": "nan" if i == 0 else 0.5} for i, r in enumerate(rewards)]
  if resumed_at is not None:   # a crash left a row the resumed run wrote again
    lines.insert(resumed_at, dict(lines[resumed_at], reward_mean=-1.0))
  (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  if evals is not None:
    (d / "evals.json").write_text(json.dumps(
        {str(s): {"domains": {"math": {"accuracy": a, "n": 10}}} for s, a in evals.items()}))
  for name, obj in (("result.json", result), ("failed.json", failure)):
    if obj is not None:
      (d / name).write_text(json.dumps(obj))
  return runs.load_run(str(d))


def test_a_run_is_read_back_step_by_step(tmp_path):
  r = _write_run(tmp_path / "a", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
                 evals={-1: 0.0, 0: 0.2, 5: 0.3, 10: 0.5}, resumed_at=4)
  steps, v = r.series("reward_mean")
  np.testing.assert_array_equal(steps, np.arange(1, 11))   # one row per step
  np.testing.assert_allclose(v, np.arange(1, 11) / 10)     # the later row of step 5 wins
  assert r.final("reward_mean") == pytest.approx(0.95)     # last fifth: steps 9-10
  assert math.isnan(r.series("entropy")[1][0]) and r.final("entropy") == 0.5
  assert r.holdout() == {"math": 0.5}
  np.testing.assert_array_equal(r.holdout_series("math")[0], [0, 5, 10])
  assert r.status == "partial" and math.isnan(r.final("nothing"))


def test_the_table_pools_seeds_and_names_failures(tmp_path):
  a = report.ArmRuns("a", {
      0: _write_run(tmp_path / "a0", [0.2] * 5, kl=0.01, evals={0: 0.1, 5: 0.30},
                    result={"wall_s": 60}),
      1: _write_run(tmp_path / "a1", [0.4] * 5, kl=0.03, evals={0: 0.1, 5: 0.50},
                    result={"wall_s": 180})})
  b = report.ArmRuns("b", {
      0: _write_run(tmp_path / "b0", [0.5] * 5, evals={0: 0.1, 5: 0.9}, result={"wall_s": 60}),
      1: _write_run(tmp_path / "b1", [0.5] * 2, failure={"error": "ValueError: x|y"})})
  header, rows = report.table([a, b])
  t = {row[0]: dict(zip(header, row)) for row in rows}
  sd = np.std([0.2, 0.4], ddof=1)
  assert t["a"]["reward"] == f"0.300 ± {sd:.3f}"
  assert t["a"]["holdout math (%)"] == f"40.0 ± {100 * np.std([0.3, 0.5], ddof=1):.1f}"
  assert t["a"]["KL"] == f"0.020 ± {np.std([0.01, 0.03], ddof=1):.3f}"
  assert t["a"]["wall (min)"] == f"2.0 ± {np.std([1.0, 3.0], ddof=1):.1f}"
  assert t["a"]["status"] == "done" and t["a"]["seeds"] == "0,1"
  # b: only seed 0 finished; no reference policy, so no KL; seed 1's error is named
  assert t["b"]["reward"] == "0.500" and t["b"]["KL"] == "-"
  assert t["b"]["status"] == "failed: seed 1: ValueError: x|y"
  md = report.markdown_table(header, rows)
  assert "ValueError: x\\|y" in md and len(md.splitlines()) == 4


def test_a_run_with_many_domains_reports_each_domains_paired_change(tmp_path):
  d = tmp_path / "many"
  d.mkdir()
  (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n"
                                           for s in range(1, 11)))
  before = [1] * 5 + [0] * 15
  evals = {str(s): {"domains": {}} for s in (0, 5, 10)}
  for i in range(12):
    name = f"dom{i:02d}"
    evals["0"]["domains"][name] = {"accuracy": 0.25, "correct": before}
    if i == 0:     # 15 more right of 20, paired with the same tasks
      after = [1] * 20
    elif i == 1:   # lost 4 of its 5
      after = [1] + [0] * 19
    else:
      after = before
    # domain 2 is evaluated at step 5 only (rotation): its change is to that evaluation
    evals["5" if i == 2 else "10"]["domains"][name] = {"accuracy": sum(after) / 20,
                                                       "correct": after}
  (d / "evals.json").write_text(json.dumps(evals))
  run = runs.load_run(str(d))
  ch = report.holdout_changes(run)
  assert [c["domain"] for c in ch][:1] == ["dom00"] and ch[-1]["domain"] == "dom01"
  assert {c["domain"]: c["step"] for c in ch}["dom02"] == 5
  top = ch[0]["gain"]
  assert top.estimate == pytest.approx(0.75) and top.low > 0
  np.testing.assert_allclose(
      [top.low, top.high],
      [v for v in (report.intervals.paired_gain([1] * 20, before).low,
                   report.intervals.paired_gain([1] * 20, before).high)])
  assert ch[-1]["gain"].estimate == pytest.approx(-0.2)
  path, header, _ = report.write_run(str(d))
  assert not [h for h in header if h.startswith("holdout ")]   # 12 domains: no columns
  text = open(path).read()
  assert ("12 domains; mean change +4.6 points; 1 rose and 1 fell with the paired 95 % "
          "interval clear of 0 (rose: dom00; fell: dom01)") in text
  assert "| dom00 | 25.0 | 100.0 | 10 | +75.0 [" in text
