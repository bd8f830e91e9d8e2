"""The fleet on an existing Ray cluster, as an operator runs one: a head node and a
worker node started with `ray start` (one CPU each), the fleet joining with
`ray_address`. Members are placed by resources, one per node (SPREAD, one CPU a member
where the cluster has no GPUs); the worker node going away is a member death: its
requests are served by the member that is left, and the generate call completes."""

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

from rlpt.rollout import Fleet, GenerateRequest, SamplingParams
from rlpt.rollout.fleet import EngineSpec
from tests.rollout import serving

RAY = str(pathlib.Path(sys.executable).with_name("ray"))


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _node(args, tmp):
  # a local test cluster: no token authentication (Ray 2.60 turns it on for `ray start`)
  env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
  env.update(serving.compile_cache_env())
  return subprocess.Popen([RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats",
                           *args], env=env, stdout=open(os.path.join(tmp, "node.log"), "a"),
                          stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  import ray
  if ray.is_initialized():
    ray.shutdown()
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
  if ray.is_initialized():
    ray.shutdown()
  for p in (worker, head):
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGTERM)
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
  shutil.rmtree(tmp, ignore_errors=True)


def _requests(tok, k, tag):
  return [GenerateRequest(prompt_ids=tuple(tok.encode(f"item {i}: the")),
                          sampling=SamplingParams(max_new_tokens=8, temperature=0.0,
                                                  ignore_eos=True),
                          request_id=f"{tag}{i}") for i in range(k)]


def test_members_are_placed_one_per_node_and_a_lost_node_is_a_member_death(cluster, tmp_path):
  import ray
  tok = serving.smollm2_tokenizer()
  model_dir = serving.save_tiny_hf(str(tmp_path / "tiny"), tok)
  engine_kw = tuple((k, getattr(serving.TINY_ENGINE, k)) for k in
                    ("max_batch", "max_len", "kv_cache_mib", "min_prompt_bucket",
                     "length_multiple"))
  deadline = time.time() + 120
  ray.init(address=cluster["address"], log_to_driver=False)
  while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    assert time.time() < deadline, "the worker node did not join"
    time.sleep(0.5)
  fleet = Fleet([EngineSpec(model=model_dir, engine=engine_kw)] * 2,
                ray_address=cluster["address"], health_interval_s=0.5, client_retries=0)
  try:
    assert fleet.resources["num_cpus"] == 1 and fleet.resources["scheduling_strategy"] == "SPREAD"
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    placed = [m["node_id"] for m in fleet.member_info()]
    assert set(placed) == nodes and len(set(placed)) == 2, (placed, nodes)
    first = fleet.generate(_requests(tok, 6, "a"))
    assert len(first) == 6
    worker_node = [n["NodeID"] for n in ray.nodes()
                   if n["Alive"] and not n.get("Resources", {}).get("node:__internal_head__")]
    # the worker node goes away (its raylet and the member actor on it with it)
    os.killpg(cluster["worker"].pid, signal.SIGTERM)
    cluster["worker"].wait(60)
    after = fleet.generate(_requests(tok, 6, "b"))
    assert sorted(c.request_id for c in after) == [f"b{i}" for i in range(6)]
    assert [c.token_ids for c in after] == [c.token_ids for c in first]   # same weights
    assert fleet.stats["member_failures"] >= 1
    info = fleet.member_info()
    lost = [m for m in info if not m["healthy"]]
    assert len(lost) == 1 and placed[lost[0]["index"]] in worker_node, (info, worker_node)
  finally:
    fleet.shutdown()
