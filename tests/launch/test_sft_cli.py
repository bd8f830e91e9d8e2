"""launch.sft end to end: a short supervised warm-up on the smoke config."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sft(*args):
  return subprocess.run([sys.executable, "-m", "launch.sft", "--config=configs/smoke.py", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_zero_steps_is_a_config_error(tmp_path):
  r = _sft("--config.sft.steps=0", f"--workdir={tmp_path}/wd")
  assert r.returncode == 2
  assert "config.sft.steps = 0" in r.stderr and "Traceback" not in r.stderr


def test_short_sft_trains_saves_and_restores(tmp_path):
  wd = tmp_path / "wd"
  r = _sft("--config.sft.steps=3", f"--workdir={wd}")
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads((wd / "sft" / "sft_summary.json").read_text())
  assert summary["steps"] == 3 and len(summary["losses"]) == 3
  assert summary["losses"][-1] < summary["losses"][0]
  assert (wd / "sft" / "3").is_dir(), "the SFT weights are an Orbax checkpoint at step 3"
  # A second run on the same workdir restores the finished SFT instead of training again.
  again = _sft("--config.sft.steps=3", f"--workdir={wd}")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "(restored)" in again.stdout + again.stderr
  assert json.loads((wd / "sft" / "sft_summary.json").read_text()) == summary
