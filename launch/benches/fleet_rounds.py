r"""RL rounds through the rollout fleet: whole rounds per member (batch routing and the
server's gathering window) beside per-request routing with no window (the fleet
before commit 2cd7f53), and the embedded engine for reference.

  python -m launch.bench fleet_rounds [--json=FILE] [--rounds=6] [--members=2]

Every side serves SmolLM2-135M-Instruct with configs/default.py's engine settings and
generates configs/default.py's rounds: prompts_per_step (12) prompts x rollout.n (8)
samples at temperature 1, rollout.max_new_tokens (32) new tokens, prompts drawn from
the default's domains (holdout tasks, a fixed draw per round, the same on every side).
The fleet sides start `--members` server processes (Ray actors, `Fleet` as
`rollout.engine = "fleet"` builds it), warm up on 2 rounds, then run `--rounds` rounds
with two in flight (rl.async_rounds = 2, as the async loop does); the embedded engine
runs them one after another. Rows: seconds per round, engine batches per round on the
members (from /server_info), and new tokens per second.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time

from launch.benches import common


def _rounds(engine, rounds: list, s, *, concurrent: int) -> tuple[float, int]:
  """(wall seconds, new tokens) of generating `rounds` with `concurrent` in flight."""
  from rlpt.train import generation
  sp = s.rollout.sampling()
  out: list[int] = []
  todo = list(enumerate(rounds))
  lock = threading.Lock()

  def worker():
    while True:
      with lock:
        if not todo:
          return
        i, tasks = todo.pop(0)
      rs = generation.generate(engine, tasks, n=s.rollout.n, sampling=sp,
                               seeds=[1000 * i + g for g in range(len(tasks))])
      with lock:
        out.append(sum(len(r.completion_ids) for r in rs))
  t0 = time.perf_counter()
  threads = [threading.Thread(target=worker) for _ in range(concurrent)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return time.perf_counter() - t0, sum(out)


def _batches(fleet) -> int:
  async def q():
    return [(await m.client.server_info())["internal_states"][0].get("batches", 0)
            for m in fleet.members]
  return sum(fleet._call(q()))


def _fleet_side(s, tok, base: str, warm, measured, *, whole: bool, root: str):
  """(wall s, new tokens, engine batches) of the measured rounds through a fleet whose
  members serve the HF directory `base`."""
  import dataclasses
  from rlpt.rollout.fleet import Fleet
  from rlpt.train import fleet_engine
  specs = fleet_engine.member_specs(s, base, log_dir=root)
  if not whole:  # the routing and batching before 2cd7f53
    specs = [dataclasses.replace(sp, settings=dataclasses.replace(
        sp.settings, gather_quiet_s=0.0, gather_max_s=0.0)) for sp in specs]
  fleet = Fleet(specs, num_cpus=2, tokenizer=tok, health_interval_s=2.0,
                batch_samples=s.data.prompts_per_step * s.rollout.n if whole else 0)
  try:
    _rounds(fleet, warm, s, concurrent=1)
    b0 = _batches(fleet)
    wall, toks = _rounds(fleet, measured, s, concurrent=2)
    return wall, toks, _batches(fleet) - b0
  finally:
    fleet.shutdown()


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench fleet_rounds")
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--members", type=int, default=2)
  a = p.parse_args(args)
  logging.disable(logging.WARNING)
  import numpy as np
  from configs import default
  from rlpt.models import load_model
  from rlpt.train import build, settings

  cfg = default.get_config()
  cfg.rollout.engine, cfg.fleet.members = "fleet", a.members
  s = settings.check_config(cfg)
  model, tok = load_model(s.model.name)
  pool = [t for d in sorted(s.data.weights)
          for t in build.task_source(d, s.data, seed=s.seed).holdout(40)]
  rng = np.random.default_rng(0)
  G = s.data.prompts_per_step
  draw = [[pool[j] for j in rng.choice(len(pool), G, replace=False)]
          for _ in range(a.rounds + 2)]
  warm, measured = draw[:2], draw[2:]
  from rlpt.models.hf_checkpoint import save_hf
  with tempfile.TemporaryDirectory(prefix="rlpt-fleet-rounds-") as root:
    base = os.path.join(root, "base.hf")
    save_hf(model, tok, base)
    w1, t1, b1 = _fleet_side(s, tok, base, warm, measured, whole=True, root=root)
    w0, t0, b0 = _fleet_side(s, tok, base, warm, measured, whole=False, root=root)
  eng = build.embedded_engine(s, model, tok)
  _rounds(eng, warm, s, concurrent=1)
  we, te = _rounds(eng, measured, s, concurrent=1)
  R = len(measured)
  note = f"{a.members} members, {R} rounds of {G} x {s.rollout.n}, two in flight"
  return [
      common.Row("seconds per round", w1 / R, w0 / R, "s", False, note),
      common.Row("engine batches per round", b1 / R, b0 / R, "batches", False,
                 "summed over the members"),
      common.Row("new tokens / s", t1 / w1, t0 / w0, "tok/s", True,
                 f"{t1} and {t0} new tokens (same per-request seeds on both sides)"),
      common.Row("fleet (whole rounds) vs embedded engine, seconds per round", w1 / R, we / R,
                 "s", False, f"embedded: {R} rounds one after another, {te} new tokens"),
  ]
