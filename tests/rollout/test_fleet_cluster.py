"""The fleet on an existing Ray cluster, as an operator runs one: a head node and a
worker node started with `ray start` (one CPU each), the fleet joining with
`ray_address`. Members are placed by resources, one per node (SPREAD, one CPU a member
where the cluster has no GPUs); the worker node going away is a member death: its
requests are served by the member that is left, and the generate call completes.

The fleet's driver runs in its own process (tests/rollout/fleet_cluster_driver.py) and
every Ray process here gets an environment without the suite's RAY_* variables: in two
clean-clone suite runs the in-process version of this test had its member actor
cancelled before it ran, while it passed alone."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.rollout import serving

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAY = str(pathlib.Path(sys.executable).with_name("ray"))


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env() -> dict[str, str]:
  # A local test cluster: no token authentication (Ray 2.60 turns it on for `ray start`).
  # A loaded machine (the suite's other worker compiling) can take minutes to start a
  # worker process that imports JAX: past Ray's 60 s registration timeout the raylet
  # cancels the actor, so the test cluster allows 10 minutes.
  env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
  env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
             RAY_worker_register_timeout_seconds="600", RLPT_ROOT=str(ROOT))
  env.update(serving.compile_cache_env())
  return env


def _node(args, tmp):
  return subprocess.Popen([RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats",
                           *args], env=_env(), stdout=open(os.path.join(tmp, "node.log"), "a"),
                          stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def cluster():
  tmp = tempfile.mkdtemp(prefix="/tmp/rc")   # short: Ray's socket paths have a length cap
  port = _port()
  head = _node(["--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                "--include-dashboard=false", f"--temp-dir={tmp}"], tmp)
  address = f"127.0.0.1:{port}"
  deadline = time.time() + 120
  while True:   # the GCS must answer before a worker node can join
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      break
    except OSError:
      assert time.time() < deadline and head.poll() is None, open(f"{tmp}/node.log").read()
      time.sleep(0.5)
  worker = _node([f"--address={address}", "--node-ip-address=127.0.0.1"], tmp)
  yield dict(address=address, head=head, worker=worker, tmp=tmp)
  for p in (worker, head):
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGTERM)
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
  shutil.rmtree(tmp, ignore_errors=True)


def test_members_are_placed_one_per_node_and_a_lost_node_is_a_member_death(cluster, tmp_path):
  model_dir = serving.save_tiny_hf(str(tmp_path / "tiny"), serving.smollm2_tokenizer())
  out = tmp_path / "out.json"
  proc = subprocess.run([sys.executable, str(ROOT / "tests/rollout/fleet_cluster_driver.py"),
                         cluster["address"], str(cluster["worker"].pid), model_dir, str(out)],
                        env=_env(), capture_output=True, text=True, timeout=900)
  node_log = open(os.path.join(cluster["tmp"], "node.log")).read()[-3000:]
  if proc.returncode != 0:  # whole, in the captured output (an assert's repr truncates it)
    print("driver stdout:\n" + proc.stdout[-3000:] + "\ndriver stderr:\n" + proc.stderr[-8000:]
          + "\nnode log:\n" + node_log)
  assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:], node_log)
  r = json.loads(out.read_text())
  assert r["resources"]["num_cpus"] == 1 and r["resources"]["scheduling_strategy"] == "SPREAD"
  assert sorted(set(r["placed"])) == r["nodes"] and len(set(r["placed"])) == 2, r
  assert len(r["first"]) == 6
  assert sorted(r["after_ids"]) == [f"b{i}" for i in range(6)]
  assert r["after"] == r["first"]            # the member left has the same weights
  assert r["member_failures"] >= 1
  lost = [m for m in r["info"] if not m["healthy"]]
  assert len(lost) == 1 and r["placed"][lost[0]["index"]] in r["worker_node"], r
  assert cluster["worker"].wait(60) is not None
