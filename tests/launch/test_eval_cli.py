"""launch.eval: a run's checkpoints reproduce its own holdout records; pass@k; bad input."""

import json
import pathlib
import subprocess
import sys

import pytest

from rlpt.train import evaluation

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ["--config=configs/ablation.py:grpo", "--config.total_steps=20",
          "--config.eval.every=10", "--config.checkpoint.every=10"]


def _run(module, *args, timeout=300):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout)


def test_pass_at_k_matches_hand_computed_values():
  # n=5, c=2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@4 = 1 - 0 = 1
  assert evaluation.pass_at_k(5, 2, 1) == pytest.approx(0.4)
  assert evaluation.pass_at_k(5, 2, 2) == pytest.approx(0.7)
  assert evaluation.pass_at_k(5, 2, 4) == 1.0
  # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252
  assert evaluation.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
  assert evaluation.pass_at_k(200, 0, 10) == 0.0
  assert evaluation.pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000)
  with pytest.raises(ValueError, match=r"1 <= k <= n .* k=5, n=4"):
    evaluation.pass_at_k(4, 1, 5)
  with pytest.raises(ValueError, match="5 correct out of 4"):
    evaluation.pass_at_k(4, 5, 1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  wd = tmp_path_factory.mktemp("eval") / "run"
  r = _run("launch.train", *CONFIG, f"--workdir={wd}")
  assert r.returncode == 0, r.stderr[-3000:]
  return wd


def _greedy(wd, step):
  return json.load(open(wd / "evals.json"))[str(step)]["domains"]


@pytest.mark.slow
def test_checkpoints_reproduce_the_runs_own_holdout_records(run, tmp_path):
  r = _run("launch.eval", *CONFIG, f"--checkpoint={run}", "--n=4", "--k=1,2")
  assert r.returncode == 0, r.stderr[-3000:]
  last = json.load(open(run / "evals" / "step_20.json"))
  assert last["step"] == 20 and last["greedy"] == _greedy(run, 20)   # every field, per task
  assert (run / "evals" / "step_20.png").read_bytes()[:4] == b"\x89PNG"
  sampled = last["sampled"]["synthetic"]
  assert sampled["n_samples"] == 16 * 4 and 0.0 <= sampled["pass@1"] <= sampled["pass@2"] <= 1.0
  assert "pass@2 (%)" in r.stdout and "synthetic" in r.stdout
  # an earlier step, and the initial model (the run's step-0 record: no SFT, same seed)
  r = _run("launch.eval", *CONFIG, f"--checkpoint={run}/10", "--n=2", "--k=1",
           f"--out={tmp_path}")
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.load(open(tmp_path / "step_10.json"))["greedy"] == _greedy(run, 10)
  r = _run("launch.eval", *CONFIG, "--model=tiny", "--n=2", "--k=1", f"--out={tmp_path}")
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.load(open(tmp_path / "tiny.json"))["greedy"] == _greedy(run, 0)
  assert _greedy(run, 0) != _greedy(run, 20)   # the records differ, so the loads matter
  r = _run("launch.eval", *CONFIG, f"--checkpoint={run}/10", "--n=0", "--name=greedy",
           f"--out={tmp_path}")  # greedy only
  assert r.returncode == 0, r.stderr[-3000:]
  only = json.load(open(tmp_path / "greedy.json"))
  assert only["greedy"] == _greedy(run, 10) and only["sampled"] == {} and only["ks"] == []
  assert "pass@" not in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--checkpoint=/nonexistent/run"], "no run there"),
    (["--checkpoint=RUN/7"], "no RL checkpoint at step 7 (steps on disk: [10, 20])"),
    (["--checkpoint=RUN", "--config.model.tiny.hidden=32"], "model.tiny"),
    (["--checkpoint=RUN", "--n=2", "--k=4"], "pass@4 needs 1 <= k <= n = 2"),
    (["--checkpoint=RUN", "--n=-1"], "--n wants samples per task >= 0"),
    (["--checkpoint=RUN", "--domains=math"], "--domains ['math'] are not among"),
    (["--model=/nonexistent.gguf"], "/nonexistent.gguf"),
])
@pytest.mark.slow
def test_bad_input_is_one_clear_line(run, args, message):
  args = [a.replace("RUN", str(run)) for a in args]
  r = _run("launch.eval", *CONFIG, *args, timeout=120)
  assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
  assert message in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
