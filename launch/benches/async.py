r"""Asynchronous against synchronous RL on one heavy-tailed workload, through the fleet.

  python -m launch.bench async [--json=FILE] [--steps=5] [--warmup=2] [--members=1]
                               [--max_staleness=2] [--max_new_tokens=512]
                               [--prompts_per_step=4] [--n=4] [--inflight=finish]
                               [--workdir=DIR]

Both sides are `python -m launch.train` runs (children of this process, one after the
other, on the same machine) of configs/default.py's SmolLM2-135M-Instruct with
`rollout.engine=fleet` (`members` rollout server processes as Ray actors, each weight
sync an Orbax version they load), no SFT, no holdout, no dynamic sampling (every step
trains prompts_per_step x n trajectories), on a mix of HumanEval "code" (verified by
running the tests in gVisor), "math" and reasoning-gym chain_sum, with a generation
budget far above the median answer: response lengths are heavy-tailed (the table's
`response length, longest / median` row; >= 8x is the workload's definition).

  rlpt       `--config.rl.mode=async --config.rl.max_staleness=N --config.rl.inflight=I`
  baseline   `--config.rl.mode=sync`

Figures are over the steps after `warmup` (compilation excluded): trained trajectories
per second (ratio > 1: async trains faster), and the engine's busy fraction (the
fraction of wall time with a generation in progress: in sync mode time/rollout_s over
time/step_s; in async mode the producers' busy seconds over the same window).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from launch.benches import common

BASELINE_NAME = "sync"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _overrides(a, mode: str) -> list[str]:
  return [
      f"--config.total_steps={a.warmup + a.steps}", "--config.sft.steps=0",
      "--config.data.holdout_per_domain=0", "--config.eval.base_tasks=0",
      "--config.checkpoint.every=1000", "--config.rl.dynamic_sampling=False",
      "--config.rollout.engine=fleet", f"--config.fleet.members={a.members}",
      f"--config.rollout.max_new_tokens={a.max_new_tokens}",
      f"--config.data.prompts_per_step={a.prompts_per_step}", f"--config.rollout.n={a.n}",
      f"--config.rl.mode={mode}",
      f"--config.rl.max_staleness={a.max_staleness if mode == 'async' else 0}",
  ] + ([f"--config.rl.inflight={a.inflight}"] if mode == "async" else [])


def _domains_config(workdir: str) -> str:
  """A config file: configs/default.py with the bench's domain mix (the one the figures in
  docs/benchmarks.md were measured on: one-digit chain sums, math over gcd and
  chain_sum; the default experiment's own mix changed for issue 26)."""
  path = os.path.join(workdir, "bench_async_config.py")
  with open(path, "w") as f:
    f.write(
        "import ml_collections\n"
        "from configs import default\n\n\n"
        "def get_config(arg=None):\n"
        "  c = default.get_config(arg)\n"
        "  c.data.domains = ml_collections.ConfigDict(\n"
        "      {'code': 1.0, 'math': 1.0, 'rg/chain_sum': 1.0})\n"
        "  c.data.rg_config = ml_collections.ConfigDict(\n"
        "      {'rg/chain_sum': {'min_terms': 2, 'max_terms': 3, 'max_digits': 1}})\n"
        "  c.data.math_generators = 'gcd,chain_sum'\n"
        "  return c\n")
  return path


def _run(a, mode: str, config: str, workdir: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  cmd = [sys.executable, "-m", "launch.train", f"--config={config}", f"--workdir={workdir}",
         *_overrides(a, mode)]
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  if r.returncode != 0:
    raise RuntimeError(f"bench async: the {mode} run failed (rc {r.returncode}):\n"
                       f"{r.stderr[-3000:]}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = {}
    for line in f:
      x = json.loads(line)
      if int(x.get("step", 0)) > 0:
        rows[int(x["step"])] = x
  from rlpt.data.trajectories import read_trajectories
  t = read_trajectories(os.path.join(workdir, "trajectories"),
                        columns=["step", "outcome", "completion_ids", "domain"]).to_pydict()
  window = [s for s in sorted(rows) if s > a.warmup]
  wall = sum(float(rows[s]["time/step_s"]) for s in window)
  trained = sum(1 for s, o in zip(t["step"], t["outcome"]) if s > a.warmup and o == "trained")
  if mode == "async":
    first, last = rows[a.warmup], rows[window[-1]]
    busy = ((last["async/engine_busy_s"] - first["async/engine_busy_s"])
            / max(last["async/wall_s"] - first["async/wall_s"], 1e-9))
  else:
    busy = sum(float(rows[s]["time/rollout_s"]) for s in window) / max(wall, 1e-9)
  lengths = [len(c) for c in t["completion_ids"]]
  return {"traj_per_s": trained / max(wall, 1e-9), "engine_busy": busy, "wall_s": wall,
          "trained": trained, "lengths": lengths,
          "staleness": [float(rows[s].get("staleness", 0)) for s in window],
          "staleness_max": max(float(rows[s].get("staleness_max", 0)) for s in window),
          "code": sum(1 for d in t["domain"] if d == "code"),
          "sync_s": statistics.mean(float(rows[s]["time/sync_s"]) for s in window),
          "load_s": statistics.mean(float(rows[s].get("time/sync_load_s", 0)) for s in window)}


def run(argv: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench async")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--members", type=int, default=1)
  p.add_argument("--max_staleness", type=int, default=2)
  p.add_argument("--max_new_tokens", type=int, default=512)
  p.add_argument("--prompts_per_step", type=int, default=4)
  p.add_argument("--n", type=int, default=4)
  p.add_argument("--inflight", default="finish", choices=("finish", "abort", "continue"),
                 help="async side's rl.inflight: requests running across a weight update "
                      "finish on the old version, abort and rerun, or continue under the new")
  p.add_argument("--workdir", default=None)
  a = p.parse_args(argv)
  if a.steps < 1 or a.warmup < 1:
    p.error("--steps and --warmup must be >= 1")
  root = a.workdir or tempfile.mkdtemp(prefix="rlpt_bench_async_")
  os.makedirs(root, exist_ok=True)
  config = _domains_config(root)
  res = {m: _run(a, m, config, os.path.join(root, m)) for m in ("sync", "async")}
  lengths = res["sync"]["lengths"] + res["async"]["lengths"]
  med, longest = statistics.median(lengths), max(lengths)
  s, y = res["sync"], res["async"]
  return [
      common.Row("trained trajectories / s", y["traj_per_s"], s["traj_per_s"], "traj/s",
                 note=f"{a.steps} steps after {a.warmup} warm-up; {a.members} member(s); "
                      f"max_staleness={a.max_staleness}; inflight={a.inflight}"),
      common.Row("engine busy fraction", y["engine_busy"], s["engine_busy"], "",
                 note="goal >= 0.8 in async"),
      common.Row("wall time of the measured steps", y["wall_s"], s["wall_s"], "s",
                 higher_is_better=False),
      common.Row("learner's wait for the weight sync per step", y["sync_s"], s["sync_s"], "s",
                 higher_is_better=False,
                 note=f"sync: Orbax publish + fleet load; async: host copy (the publish + "
                      f"load, {y['load_s']:.1f} s, run in the background)"),
      common.Row("staleness of trained rows (mean, async)", statistics.mean(y["staleness"]),
                 None, "versions", note=f"max {y['staleness_max']:.0f}"),
      common.Row("response length, longest / median", longest / max(med, 1), None, "x",
                 note=f"median {med:.0f}, longest {longest} tokens; "
                      f"{s['code'] + y['code']} code rollouts sandbox-verified"),
  ]
