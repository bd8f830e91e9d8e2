"""Multi-process training on localhost: 2 CPU processes x 2 fake devices joined by
`jax.distributed` (rlpt.train.distributed) against 1 process x 4 devices. The learner's
3 steps give the same metrics and parameters (tolerance below); an Orbax checkpoint
saved by 2 processes restores in 1 and back; a process killed with SIGKILL ends the
other with an error within the heartbeat bound instead of a hang; bad setups are named."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "train" / "distributed_worker.py"
# Same program, same reduction over 4 devices: measured bit-identical; allow float noise.
ATOL = 1e-6


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env():
  env = dict(os.environ, RLPT_ROOT=str(ROOT), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return env


def _start(mode, pid, nproc, port, out, ckpt=None):
  args = [sys.executable, str(WORKER), mode, str(pid), str(nproc), str(port), str(out)]
  return subprocess.Popen(args + ([str(ckpt)] if ckpt else []), env=_env(), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(mode, nproc, out, ckpt=None, timeout=300):
  port = _port()
  procs = [_start(mode, i, nproc, port, out, ckpt) for i in range(nproc)]
  for p in procs:
    text, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, text[-3000:]
  return json.loads(pathlib.Path(f"{out}.json").read_text()), np.load(f"{out}.npz")


def _assert_same_params(a, b):
  assert sorted(a.files) == sorted(b.files)
  for k in a.files:
    np.testing.assert_allclose(b[k], a[k], atol=ATOL, err_msg=k)


def test_two_processes_train_as_one_process_with_the_same_devices(tmp_path):
  one, p1 = _run("steps", 1, tmp_path / "one")
  two, p2 = _run("steps", 2, tmp_path / "two")
  assert (one["processes"], two["processes"]) == (1, 2)
  assert one["devices"] == two["devices"] == 4
  for a, b in zip(one["metrics"], two["metrics"]):
    for k in ("loss", "grad_norm", "entropy", "tokens"):
      assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-6), k
  _assert_same_params(p1, p2)


def test_a_checkpoint_saved_by_two_processes_restores_in_one_and_back(tmp_path):
  _, saved = _run("save", 2, tmp_path / "save2", tmp_path / "ck2")
  info1, restored1 = _run("restore", 1, tmp_path / "restore1", tmp_path / "ck2")
  assert info1["step"] == 3
  _, saved1 = _run("save", 1, tmp_path / "save1", tmp_path / "ck1")
  info2, restored2 = _run("restore", 2, tmp_path / "restore2", tmp_path / "ck1")
  # one more step from the restored state: the same parameters either way round
  _assert_same_params(restored1, restored2)
  assert info2["next"]["grad_norm"] == pytest.approx(info1["next"]["grad_norm"], rel=1e-6)
  _assert_same_params(saved, saved1)


def test_sigkill_of_one_process_ends_the_other_instead_of_hanging(tmp_path):
  port = _port()
  out = tmp_path / "loop"
  procs = [_start("loop", i, 2, port, out) for i in range(2)]
  deadline = time.time() + 240
  while not pathlib.Path(f"{out}.ready").exists():
    assert time.time() < deadline and all(p.poll() is None for p in procs), \
        procs[0].communicate()[0][-2000:]
    time.sleep(0.5)
  procs[1].send_signal(signal.SIGKILL)
  t0 = time.time()
  try:
    text, _ = procs[0].communicate(timeout=90)
  except subprocess.TimeoutExpired:
    procs[0].kill()
    pytest.fail("process 0 hung after process 1 was killed")
  assert procs[0].returncode != 0
  assert time.time() - t0 < 90
  assert any(w in text for w in ("heartbeat", "UNAVAILABLE", "DEADLINE", "task", "Gloo",
                                 "connection", "Connection")), text[-2000:]


def test_processes_with_different_configs_or_a_mesh_that_misses_devices_are_refused(tmp_path):
  port = _port()
  procs = [_start("config", i, 2, port, tmp_path / "cfg") for i in range(2)]
  texts = [p.communicate(timeout=180)[0] for p in procs]
  for p, text in zip(procs, texts):
    assert p.returncode != 0, text[-2000:]
    assert "processes [1] were started with a config that differs" in text, text[-2000:]
    assert "config.mesh {'data': 2} has 2 devices; the 2 processes have 4" in text


def test_bad_setups_are_named():
  from rlpt.train import distributed
  with pytest.raises(distributed.DistributedError, match="--coordinator_address"):
    distributed.initialize(None, 2, 0)
  with pytest.raises(distributed.DistributedError, match="HOST:PORT"):
    distributed.initialize("localhost", 2, 0)
  with pytest.raises(distributed.DistributedError, match="--process_id=2"):
    distributed.initialize("127.0.0.1:1234", 2, 2)
  assert distributed.initialize(None, None, None) is False    # one process: nothing to do


def test_an_unreachable_coordinator_fails_within_the_bound(tmp_path):
  code = ("import sys; sys.path.insert(0, %r)\n"
          "from rlpt.train import distributed\n"
          "distributed.initialize('127.0.0.1:%d', 2, 1, timeout_s=5)\n") % (str(ROOT), _port())
  t0 = time.time()
  r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                     timeout=120)
  assert r.returncode != 0 and time.time() - t0 < 90
  assert "could not join the coordinator at 127.0.0.1" in r.stderr, r.stderr[-2000:]
