"""compute_rewards throughput on a 1,000-task mix spanning every built-in domain.

  python -m launch.bench rewards [--n=1000] [--seed=0] [--code=16] [--geometry=6]

The mix: `--code` HumanEval tasks, `--geometry` geometry tasks, 30 extraction
reports (2k-100k tokens), 100 math tasks, and the rest spread over all 106
reasoning-gym generators (>= 100 domains in all). Half of the completions are
the reference answer, half a wrong one.

rlpt: `rlpt.rewards.compute_rewards` on each family's tasks as one batch (the
worker pool for parsed answers, concurrent sandbox runs for code and geometry;
the pool, whose forkserver pre-builds every scorer, is started before timing),
and on the whole mix at once, after an untimed pass over one task per domain.
Baseline: the same verifiers' `verify(task, completion)` called serially in this
process, one sample after another, with no batch API, no worker pool and no
per-sample timeout (what a training loop gets by calling the scorers directly);
its reasoning-gym scorers are built before timing too.
"""

from __future__ import annotations

import argparse
import collections
import time

from launch.benches import common

BASELINE_NAME = "serial verify()"


def _family(domain: str) -> str:
  return "rg" if domain.startswith("rg/") else domain


def build_mix(n: int, seed: int, n_code: int, n_geometry: int):
  """(tasks, completions): the benchmark's task mix, half right and half wrong."""
  from rlpt.data import sources
  from rlpt.data.sources import rg_tasks
  counts = {"code": n_code, "geometry": n_geometry, "extraction": 30, "math": 100}
  rest = n - sum(counts.values())
  gens = rg_tasks.generators()
  if rest < len(gens):
    raise ValueError(f"--n={n} leaves {rest} tasks for {len(gens)} reasoning-gym generators")
  for i, g in enumerate(gens):
    counts[f"rg/{g}"] = rest // len(gens) + (i < rest % len(gens))
  tasks, comps = [], []
  for domain, k in counts.items():
    src = sources.get_source(domain, seed=seed)
    for i in range(k):
      t = src.train(i)
      ref = src.reference(t)
      if i % 2 == 0 and ref is not None:
        comps.append(ref)
      elif domain.startswith("rg/"):
        comps.append("<answer>I am not sure</answer>")
      elif domain == "math":
        comps.append(r"\boxed{-12345}")
      elif domain == "extraction":
        comps.append("```json\n" + "{" + ", ".join(f'"{f}": 1' for f in t.answer) + "}\n```")
      else:  # code / geometry: code that runs but is wrong
        comps.append("```python\nimport math\nprint(math.pi)\n```")
      tasks.append(t)
  return tasks, comps


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="bench rewards")
  p.add_argument("--n", type=int, default=1000)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--code", type=int, default=16)
  p.add_argument("--geometry", type=int, default=6)
  a = p.parse_args(args)
  from rlpt import rewards
  from rlpt.rewards import workers
  from rlpt.types import Task

  t0 = time.perf_counter()
  tasks, comps = build_mix(a.n, a.seed, a.code, a.geometry)
  gen_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  rewards.compute_reward(Task("math", "warm-up", "1"), r"\boxed{1}")  # start the pool
  cold_s = time.perf_counter() - t0
  pool = workers.default_pool()

  from rlpt.rewards import rg
  for name in rg.generators():  # the serial baseline gets warm scorers too
    rg.warm_scorer(name)

  fams = collections.defaultdict(list)
  for i, t in enumerate(tasks):
    fams[_family(t.domain)].append(i)
  # Untimed warm-up of both paths on one cheap task per domain (first-call caches).
  first = {}
  for i, t in enumerate(tasks):
    if t.domain not in ("code", "geometry"):
      first.setdefault(t.domain, i)
  rewards.compute_rewards([tasks[i] for i in first.values()], [comps[i] for i in first.values()],
                          pool=pool)
  for i in first.values():
    rewards.get_verifier(tasks[i].domain).verify(tasks[i], comps[i])
  rows, total_rlpt, total_base = [], 0.0, 0.0
  for fam in ("rg", "math", "extraction", "code", "geometry"):
    idx = fams.get(fam, [])
    if not idx:
      continue
    ts, cs = [tasks[i] for i in idx], [comps[i] for i in idx]
    t0 = time.perf_counter()
    got = rewards.compute_rewards(ts, cs, pool=pool)
    rl = time.perf_counter() - t0
    t0 = time.perf_counter()
    for t, c in zip(ts, cs):
      rewards.get_verifier(t.domain).verify(t, c)
    base = time.perf_counter() - t0
    total_rlpt += rl
    total_base += base
    mean = sum(r.score for r in got) / len(got)
    doms = len({t.domain for t in ts})
    rows.append(common.Row(f"{fam} samples/s", len(idx) / rl, len(idx) / base, "samples/s",
                           note=f"{len(idx)} tasks, {doms} domains, mean score {mean:.2f}"))
  t0 = time.perf_counter()
  got = rewards.compute_rewards(tasks, comps, pool=pool)
  mixed = time.perf_counter() - t0
  n_dom = len({t.domain for t in tasks})
  rows.append(common.Row("whole mix, one batch samples/s", len(tasks) / mixed,
                         len(tasks) / total_base, "samples/s",
                         note=f"{len(tasks)} tasks, {n_dom} domains; baseline = sum of serial"))
  rows.append(common.Row("per-family batches samples/s", len(tasks) / total_rlpt,
                         len(tasks) / total_base, "samples/s"))
  rows.append(common.Row("worker pool cold start", cold_s, None, "s", higher_is_better=False,
                         note=f"{pool.num_workers} workers; task generation took {gen_s:.0f} s"))
  return rows
