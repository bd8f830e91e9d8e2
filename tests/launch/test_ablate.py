"""launch.ablate: a sweep of arms x seeds, killed and resumed, its report checked against
the runs' own files; bad arms refused before anything runs; a crashing arm reported."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

SWEEP = '''
import ml_collections

def get_config(arg=None):
  return ml_collections.ConfigDict(dict(
      base="configs/smoke.py:grpo",
      seeds=(0, 1),
      common=dict(total_steps=6, checkpoint=dict(every=2), eval=dict(every=3),
                  data=dict(holdout_per_domain=2)),
      arms=(("grpo", {{}}), ({second!r}, {overrides!r})),
  ))
'''


def _sweep_file(tmp_path, second="low_lr", overrides=None, name="sweep.py"):
  path = tmp_path / name
  path.write_text(SWEEP.format(second=second, overrides=overrides or {"rl.lr": 1e-3}))
  return path


def _ablate(*args, **kw):
  return subprocess.run([sys.executable, "-m", "launch.ablate", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)


def _metrics(path):
  by_step = {}
  for line in open(path):
    row = json.loads(line)
    by_step[row["step"]] = row
  return [by_step[s] for s in sorted(by_step)]


def _table(report):
  """{arm: {column: cell}} from report.md's table."""
  lines = [ln for ln in report.read_text().splitlines() if ln.startswith("|")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  out = {}
  for ln in lines[2:]:
    cells = [c.strip() for c in ln.strip("|").split("|")]
    out[cells[0]] = dict(zip(header, cells))
  return out


def _fmt(values, scale=1.0, digits=3):
  v = np.asarray(values) * scale
  return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_its_report_matches_the_runs(tmp_path):
  sweep, out = _sweep_file(tmp_path), tmp_path / "sw"
  cmd = [sys.executable, "-m", "launch.ablate", f"--sweep={sweep}", f"--workdir={out}"]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)
  # Kill the whole sweep (runner and its child) once the second run is midway.
  second = out / "grpo" / "seed_1"
  deadline = time.monotonic() + 400
  while time.monotonic() < deadline and proc.poll() is None:
    if (second / "checkpoints" / "2").exists():
      break
    time.sleep(0.2)
  assert proc.poll() is None, proc.stdout.read().decode()
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  first = out / "grpo" / "seed_0"
  assert (first / "result.json").exists() and not (second / "result.json").exists()
  first_result = (first / "result.json").read_text()

  r = _ablate(f"--sweep={sweep}", f"--workdir={out}")
  assert r.returncode == 0, r.stdout + r.stderr
  assert "grpo seed 0: finished before, not rerun" in r.stdout
  assert (first / "result.json").read_text() == first_result
  assert (first / "log.txt").read_text().count("\n=== ") == 1      # started once
  log = (second / "log.txt").read_text()
  assert log.count("\n=== ") == 2 and "resumed from step" in log, log[-2000:]
  for arm in ("grpo", "low_lr"):
    for seed in (0, 1):
      rows = _metrics(out / arm / f"seed_{seed}" / "metrics.jsonl")
      assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]

  table = _table(out / "report.md")
  assert list(table) == ["grpo", "low_lr"]
  for arm in ("grpo", "low_lr"):
    runs = [out / arm / f"seed_{s}" for s in (0, 1)]
    rows = [_metrics(d / "metrics.jsonl") for d in runs]
    # 6 steps: the last fifth is the last step
    assert table[arm]["reward"] == _fmt([m[-1]["reward_mean"] for m in rows])
    assert table[arm]["clip frac"] == _fmt([m[-1]["clip_frac"] for m in rows])
    evals = [json.load(open(d / "evals.json")) for d in runs]
    acc = [e["6"]["domains"]["synthetic"]["accuracy"] for e in evals]
    assert table[arm]["holdout synthetic (%)"] == _fmt(acc, 100.0, 1)
    walls = [json.load(open(d / "result.json"))["wall_s"] / 60 for d in runs]
    assert table[arm]["wall (min)"] == _fmt(walls, 1.0, 1)
    assert table[arm]["status"] == "done" and table[arm]["seeds"] == "0,1"
  for chart in ("reward.png", "holdout.png", "response_length.png", "entropy.png"):
    png = (out / chart).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, chart
    assert f"]({chart})" in (out / "report.md").read_text()

  # launch.report draws the same charts for one of the runs
  r = subprocess.run([sys.executable, "-m", "launch.report", f"--workdir={runs[0]}"], cwd=ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  one = _table(runs[0] / "report" / "report.md")["seed_0"]
  assert one["reward"] == f"{rows[0][-1]['reward_mean']:.3f}"
  assert (runs[0] / "report" / "entropy.png").exists()


@pytest.mark.parametrize("overrides, field, expected", [
    ({"rl.lrr": 1e-3}, "rl.lrr", "Closest valid names: rl.lr"),
    ({"rl": {"clip_eps_hgih": 0.28}}, "rl.clip_eps_hgih", "rl.clip_eps_high"),
    ({"total_steps": "many"}, "total_steps", "expects int"),
])
def test_an_arm_with_a_bad_field_is_refused_before_anything_runs(tmp_path, overrides, field,
                                                                 expected):
  sweep = _sweep_file(tmp_path, second="bad_arm", overrides=overrides)
  r = _ablate(f"--sweep={sweep}", f"--workdir={tmp_path / 'sw'}", timeout=120)
  assert r.returncode == 2, r.stdout + r.stderr
  assert "arm 'bad_arm'" in r.stderr and f"'{field}'" in r.stderr and expected in r.stderr
  assert "Traceback" not in r.stderr
  assert not (tmp_path / "sw").exists(), "nothing may run or be written for a bad arm"


@pytest.mark.slow
def test_a_crashing_arm_is_reported_and_the_others_finish_as_ray_tasks(tmp_path):
  bad = tmp_path / "broken.gguf"
  bad.write_bytes(b"not a gguf file")
  sweep = _sweep_file(tmp_path, second="broken", overrides={"model.name": str(bad)})
  out = tmp_path / "sw"
  # as Ray tasks, two at a time: the failure comes back through Ray like a success
  r = _ablate(f"--sweep={sweep}", f"--workdir={out}", "--seeds=0", "--parallel=2")
  assert r.returncode == 1, r.stdout + r.stderr
  assert "2 runs as Ray tasks, 2 at a time" in r.stdout
  assert "broken seed 0: FAILED" in r.stdout and "grpo seed 0: done" in r.stdout
  failed = json.load(open(out / "broken" / "seed_0" / "failed.json"))
  assert failed["exit"] != 0 and failed["error"]
  table = _table(out / "report.md")
  assert table["grpo"]["status"] == "done" and table["grpo"]["reward"] != "-"
  assert table["broken"]["status"] == f"failed: seed 0: {failed['error']}".replace("|", "\\|")
  assert table["broken"]["reward"] == "-"
  assert re.search(r"FAILED \(exit \d+\)", r.stdout)
