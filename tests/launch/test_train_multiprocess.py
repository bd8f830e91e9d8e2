"""launch.train on 2 CPU processes of 2 devices each (jax.distributed over localhost):
the same run as 1 process with 4 devices, and the multi-process config errors."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARGS = ["--config=configs/smoke.py", "--config.total_steps=3", "--config.mesh.data=2",
        "--config.mesh.fsdp=2", "--config.data.prompts_per_step=8",
        "--config.checkpoint.every=2", "--config.eval.every=0", "--config.sft.steps=2",
        "--config.data.holdout_per_domain=10", "--config.eval.base_tasks=0"]


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
  return env


def _launch(workdir, args, processes: int, devices: int):
  """Runs launch.train on `processes` processes; returns [(returncode, stderr)]."""
  port = _port()
  procs = []
  for i in range(processes):
    extra = ([f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
              f"--process_id={i}"] if processes > 1 else [])
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "launch.train", *args, f"--workdir={workdir}", *extra],
        cwd=ROOT, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  out = []
  for p in procs:
    try:
      _, err = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    out.append((p.returncode, err))
  return out


def _metrics(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_two_processes_train_as_one_process_with_four_devices(tmp_path):
  one = _launch(tmp_path / "one", ARGS, processes=1, devices=4)
  two = _launch(tmp_path / "two", ARGS, processes=2, devices=2)
  for rc, err in one + two:
    assert rc == 0, err[-4000:]
  a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
  assert [r["step"] for r in b] == [1, 2, 3]                       # written once
  for x, y in zip(a, b):
    # each process generated half of the step's groups: the same rollouts and rewards
    assert y["reward_mean"] == x["reward_mean"]
    # the learner on a (data=2, fsdp=2) mesh over 2 processes: float32 reduction order
    # only (measured <= 5e-7 relative)
    for k in ("loss", "grad_norm", "entropy"):
      np.testing.assert_allclose(y[k], x[k], rtol=1e-5, atol=1e-7, err_msg=k)
  # the holdout, decoded and verified half by each process, scores as in one process
  evals = [json.load(open(tmp_path / w / "evals.json")) for w in ("one", "two")]
  assert evals[1] == evals[0] and set(evals[0]) >= {"0", "3"}, evals
  steps = sorted(os.listdir(tmp_path / "two" / "trajectories"))
  assert steps == sorted(os.listdir(tmp_path / "one" / "trajectories"))
  assert sorted(os.listdir(tmp_path / "two" / "checkpoints"))[-2:] == ["2", "3"]
  # the checkpoint the 2 processes wrote together restores in 1 process (the run is
  # finished: it resumes at its end)
  again = _launch(tmp_path / "two", ARGS, processes=1, devices=4)
  assert again[0][0] == 0, again[0][1][-4000:]
  assert "resumed from step 3" in again[0][1]


@pytest.mark.parametrize("overrides, named", [
    (["--config.mesh.fsdp=1"], "config.mesh"),            # 2 of the job's 4 devices
    (["--config.rl.mode=async", "--config.rollout.engine=fleet"], "rl.mode"),
])
def test_multiprocess_config_errors_name_the_field(tmp_path, overrides, named):
  for rc, err in _launch(tmp_path / "wd", ARGS + overrides, processes=2, devices=2):
    assert rc == 2, err[-3000:]
    assert named in err and "Traceback" not in err, err[-3000:]
