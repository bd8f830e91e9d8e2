r"""Isolated runs/s and latency of a small Python test program.

  python -m launch.bench sandbox [--json=FILE] [--runs=48] [--concurrency=4] [--pool=4]

Three ways to run the same 4-line program, each `--runs` times with
`--concurrency` in flight:
  pool        rlpt.sandbox.SandboxPool: a warm, single-use gVisor container per run
  runsc do    `runsc --network=none do python3 t.py`, a new sandbox per call
              (no limits; the baseline the pool is compared to)
  subprocess  a plain unsandboxed `python3 t.py` (the floor)
Latency is per run as the caller sees it (including any wait for a warm sandbox).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from launch.benches import common

BASELINE_NAME = "runsc do / call"

PROGRAM = ("import sys\n"
           "xs = [i * i for i in range(1000)]\n"
           "assert sum(xs) == 332833500\n"
           "print('ok', len(xs))\n")


def _measure(fn, runs: int, concurrency: int) -> tuple[float, list[float], int]:
  """(runs/s, per-run latencies, failures) of `runs` calls of fn() -> bool."""
  lat, bad = [], 0

  def one(_):
    t0 = time.perf_counter()
    ok = fn()
    return time.perf_counter() - t0, ok

  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
    for dt, ok in ex.map(one, range(runs)):
      lat.append(dt)
      bad += 0 if ok else 1
  return runs / (time.perf_counter() - t0), lat, bad


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench sandbox")
  p.add_argument("--runs", type=int, default=48)
  p.add_argument("--concurrency", type=int, default=4)
  p.add_argument("--pool", type=int, default=4, help="warm sandboxes kept ready")
  a = p.parse_args(args)
  from rlpt import sandbox  # noqa: PLC0415 -- keeps `launch.bench` listing cheap
  from rlpt.sandbox import bundle  # noqa: PLC0415

  work = tempfile.mkdtemp(prefix="rlpt-bench-sandbox-")
  with open(os.path.join(work, "t.py"), "w") as f:
    f.write(PROGRAM)
  python = os.path.join(sys.prefix, "bin", "python3")
  try:
    pool = sandbox.SandboxPool(a.pool)
    try:
      pool.warm(wait=True)
      rps_pool, lat_pool, bad_pool = _measure(
          lambda: pool.run({"t.py": PROGRAM}, ["python3", "t.py"]).stdout == "ok 1000\n",
          a.runs, a.concurrency)
      stats = pool.stats
    finally:
      pool.close()
    root = os.path.join(work, "runsc-state")
    do = [bundle.runsc_path(), f"--root={root}", "--network=none", "do", python, "t.py"]
    rps_do, lat_do, bad_do = _measure(
        lambda: subprocess.run(do, cwd=work, capture_output=True).stdout == b"ok 1000\n",
        a.runs, a.concurrency)
    rps_sub, lat_sub, bad_sub = _measure(
        lambda: subprocess.run([python, "t.py"], cwd=work, capture_output=True).stdout
        == b"ok 1000\n", a.runs, a.concurrency)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  pct = common.percentile
  note = (f"{a.runs} runs, {a.concurrency} in flight, pool of {a.pool}; "
          f"failures pool/do/plain = {bad_pool}/{bad_do}/{bad_sub}; "
          f"warm hits {stats.warm_hits}, cold boots {stats.cold_boots}")
  floor = f"vs plain subprocess (floor: {rps_sub:.1f} runs/s, p50 {pct(lat_sub, 50):.3f} s)"
  return [
      common.Row("isolated runs/s", rps_pool, rps_do, "runs/s", True, note),
      common.Row("p50 latency", statistics.median(lat_pool), statistics.median(lat_do), "s",
                 False),
      common.Row("p99 latency", pct(lat_pool, 99), pct(lat_do, 99), "s", False),
      common.Row("runs/s, pool vs plain subprocess", rps_pool, rps_sub, "runs/s", True, floor),
      common.Row("p50 latency, pool vs plain subprocess", statistics.median(lat_pool),
                 statistics.median(lat_sub), "s", False),
  ]
