"""The driver of tests/rollout/test_fleet_cluster.py, run in its own process so that no
Ray state of the suite's earlier tests (a local `ray.init`, its environment variables)
reaches the cluster under test.

  python tests/rollout/fleet_cluster_driver.py ADDRESS WORKER_PGID MODEL_DIR OUT_JSON

Joins the cluster at ADDRESS, starts a 2-member fleet placed by resources, generates,
stops the worker node's process group (WORKER_PGID: its raylet and the member actor on
it), generates again, and writes what it saw to OUT_JSON.
"""

import json
import os
import signal
import sys
import time

ADDRESS, WORKER_PGID, MODEL_DIR, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, os.environ["RLPT_ROOT"])

import ray  # noqa: E402

from rlpt.rollout import Fleet, GenerateRequest, SamplingParams  # noqa: E402
from rlpt.rollout.fleet import EngineSpec  # noqa: E402
from tests.rollout import serving  # noqa: E402


def _requests(tok, k, tag):
  return [GenerateRequest(prompt_ids=tuple(tok.encode(f"item {i}: the")),
                          sampling=SamplingParams(max_new_tokens=8, temperature=0.0,
                                                  ignore_eos=True),
                          request_id=f"{tag}{i}") for i in range(k)]


def main():
  tok = serving.smollm2_tokenizer()
  engine_kw = tuple((k, getattr(serving.TINY_ENGINE, k)) for k in
                    ("max_batch", "max_len", "kv_cache_mib", "min_prompt_bucket",
                     "length_multiple"))
  ray.init(address=ADDRESS, log_to_driver=False)
  deadline = time.time() + 120
  while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    if time.time() > deadline:
      raise SystemExit("the worker node did not join")
    time.sleep(0.5)
  nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
  worker_node = [n["NodeID"] for n in ray.nodes()
                 if n["Alive"] and not n.get("Resources", {}).get("node:__internal_head__")]
  fleet = Fleet([EngineSpec(model=MODEL_DIR, engine=engine_kw)] * 2, ray_address=ADDRESS,
                health_interval_s=0.5, client_retries=0)
  try:
    placed = [m["node_id"] for m in fleet.member_info()]
    first = fleet.generate(_requests(tok, 6, "a"))
    os.killpg(WORKER_PGID, signal.SIGTERM)   # the worker node goes away
    after = fleet.generate(_requests(tok, 6, "b"))
    out = dict(resources={k: v for k, v in fleet.resources.items()}, nodes=nodes,
               worker_node=worker_node, placed=placed,
               first=[list(c.token_ids) for c in first],
               after_ids=[c.request_id for c in after],
               after=[list(c.token_ids) for c in after],
               member_failures=fleet.stats["member_failures"],
               info=[dict(index=m["index"], healthy=m["healthy"]) for m in fleet.member_info()])
  finally:
    fleet.shutdown()
    ray.shutdown()
  with open(OUT, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  main()
