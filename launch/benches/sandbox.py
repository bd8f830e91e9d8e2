r"""Isolated runs/s and latency of a small Python test program.

  python -m launch.bench sandbox [--json=FILE] [--runs=256] [--baseline-runs=48]
                                 [--concurrency=4] [--pool=6]

Ways to run the same 4-line program as `python3 t.py`, `--concurrency` in flight:
  pool        rlpt.sandbox.SandboxPool (default reuse: a warm container serves
              up to 32 clean runs, each a fresh fork of its warm pid 1 in fresh
              namespaces and tmpfs), `--runs` times: 256 runs retire and replace
              every container at least once, so the figure includes the
              steady-state boots. 4 in flight on a pool of 6 (two spare warm
              sandboxes) measured best on the 2 cores: with the pool no larger
              than the concurrency, a caller sometimes waits on a boot
  pool fresh  the same with reuse=1: a fresh container for every run
  runsc do    `runsc --network=none do python3 t.py`, a new sandbox per call
              (no limits; the baseline the pool is compared to)
  subprocess  a plain unsandboxed `python3 t.py` (the floor)
(the last three `--baseline-runs` times each). Latency is per run as the caller
sees it (including any wait for a warm sandbox).
Host CPU seconds per run (this process and all its reaped children: runsc, the
gofer, the sandbox) do not depend on how busy the shared machine is, so
2 / (CPU s per run) projects the runs/s of 2 idle cores. Then what an episode's
session (rlpt.sandbox.SandboxSession: one container held, /sandbox persisting,
reset at the end) costs per run against one-shot runs (--session-runs=0 skips it).
Last, the cost of a fresh boot vs `runsc restore` of a checkpointed waiting sandbox
(--restore=0 skips it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import resource
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


def _cpu() -> float:
  a, b = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
  return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


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


def _pool(sandbox, size: int, reuse: int, runs: int, concurrency: int):
  """(runs/s, latencies, failures, CPU s per run incl. the pool's boots, stats)."""
  c0 = _cpu()
  pool = sandbox.SandboxPool(size, reuse=reuse)
  try:
    pool.warm(wait=True)
    rps, lat, bad = _measure(
        lambda: pool.run({"t.py": PROGRAM}, ["python3", "t.py"]).stdout == "ok 1000\n",
        runs, concurrency)
  finally:
    pool.close()
  return rps, lat, bad, (_cpu() - c0) / runs, pool.stats


def _session_vs_one_shot(sandbox, runs: int, per_episode: int):
  """Per run: (session p50 s, one-shot p50 s). The same
  program `runs` times, one at a time: in sessions of `per_episode` runs (the open and
  the closing reset counted in), and as one-shot runs from a warm pool of 2."""
  pool = sandbox.SandboxPool(2)
  try:
    pool.warm(wait=True)
    ok = lambda r: r.stdout == "ok 1000\n"  # noqa: E731
    one = []
    for _ in range(runs):
      t0 = time.perf_counter()
      assert ok(pool.run({"t.py": PROGRAM}, ["python3", "t.py"]))
      one.append(time.perf_counter() - t0)
    ses = []
    for _ in range(runs // per_episode):
      t0 = time.perf_counter()
      with pool.session() as s:
        for _ in range(per_episode):
          assert ok(s.run({"t.py": PROGRAM}, ["python3", "t.py"]))
      ses.append((time.perf_counter() - t0) / per_episode)
  finally:
    pool.close()
  return statistics.median(ses), statistics.median(one)


def _boot_vs_restore(n: int) -> tuple[list[float], list[float]]:
  """Seconds from nothing to a finished `true`: fresh boot vs restore of a
  checkpoint taken while the launcher waits for its request."""
  from rlpt.sandbox import bundle, container, default_env, launcher, result  # noqa: PLC0415
  lim = result.Limits()
  fresh, restored = [], []
  for _ in range(n):
    t0 = time.perf_counter()
    c = container.Container(lim)
    c.wait_ready(120)
    assert c.execute({}, ["true"], default_env(), lim).ok
    fresh.append(time.perf_counter() - t0)
    c.finish()
  img = tempfile.mkdtemp(prefix="rlpt-ckpt-")
  c = container.Container(lim)
  try:
    c.wait_ready(120)
    subprocess.run(bundle.runsc_argv("checkpoint", f"--image-path={img}", c.cid, root=c.root),
                   check=True, capture_output=True)
  finally:
    c.kill()
  try:
    for _ in range(n):
      cid = f"rlpt-restore-{os.urandom(6).hex()}"
      b = bundle.write_bundle(cid, launcher.launcher_args(bundle.sandbox_python(),
                                                          disk_mb=lim.disk_mb), lim)
      t0 = time.perf_counter()
      p = subprocess.Popen(bundle.runsc_argv("restore", f"--image-path={img}", "--bundle", b,
                                             cid), stdin=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
      p.stdin.write(launcher.encode_request({}, ["true"], default_env(), {}))
      p.stdin.close()  # pid 1 runs the request, then sees EOF and exits
      err = p.stderr.read()
      p.wait()
      # (The run's marker went out before the checkpoint: only the trailer is new.)
      assert re.search(rb"\x00rlpt-exit:[0-9a-f]{16}:0\x00", err), err[-500:]
      restored.append(time.perf_counter() - t0)
      shutil.rmtree(b, ignore_errors=True)
  finally:
    shutil.rmtree(img, ignore_errors=True)
  return fresh, restored


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench sandbox")
  p.add_argument("--runs", type=int, default=256)
  p.add_argument("--baseline-runs", type=int, default=48,
                 help="runs of the fresh-container, runsc do and plain rows")
  p.add_argument("--concurrency", type=int, default=4)
  p.add_argument("--pool", type=int, default=6, help="warm sandboxes kept ready")
  p.add_argument("--restore", type=int, default=3, help="boots and restores to time (0: skip)")
  p.add_argument("--session-runs", type=int, default=64,
                 help="runs of the session vs one-shot rows, in episodes of 8 (0: skip)")
  a = p.parse_args(args)
  from rlpt import sandbox  # noqa: PLC0415 -- keeps `launch.bench` listing cheap
  from rlpt.sandbox import bundle  # noqa: PLC0415

  work = tempfile.mkdtemp(prefix="rlpt-bench-sandbox-")
  with open(os.path.join(work, "t.py"), "w") as f:
    f.write(PROGRAM)
  python = os.path.join(sys.prefix, "bin", "python3")
  load = os.getloadavg()[0]
  nb = a.baseline_runs
  try:
    rps_pool, lat_pool, bad_pool, cpu_pool, stats = _pool(sandbox, a.pool, 32, a.runs,
                                                          a.concurrency)
    rps_one, lat_one, bad_one, cpu_one, _ = _pool(sandbox, a.pool, 1, nb, a.concurrency)
    root = os.path.join(work, "runsc-state")
    do = [bundle.runsc_path(), f"--root={root}", "--network=none", "do", python, "t.py"]
    c0 = _cpu()
    rps_do, lat_do, bad_do = _measure(
        lambda: subprocess.run(do, cwd=work, capture_output=True).stdout == b"ok 1000\n",
        nb, a.concurrency)
    cpu_do = (_cpu() - c0) / nb
    c0 = _cpu()
    rps_sub, lat_sub, bad_sub = _measure(
        lambda: subprocess.run([python, "t.py"], cwd=work, capture_output=True).stdout
        == b"ok 1000\n", nb, a.concurrency)
    cpu_sub = (_cpu() - c0) / nb
    fresh, restored = _boot_vs_restore(a.restore) if a.restore else ([], [])
    session = _session_vs_one_shot(sandbox, a.session_runs, 8) if a.session_runs else None
  finally:
    shutil.rmtree(work, ignore_errors=True)
  pct, med = common.percentile, statistics.median
  note = (f"{a.runs} runs ({nb} per baseline), {a.concurrency} in flight, pool of {a.pool}; "
          f"load average {load:.2f} at start; failures "
          f"pool/fresh/do/plain = {bad_pool}/{bad_one}/{bad_do}/{bad_sub}; pool warm hits "
          f"{stats.warm_hits}, cold boots {stats.cold_boots}, boots {stats.boots}")
  floor = f"plain subprocess: {rps_sub:.1f} runs/s, p50 {pct(lat_sub, 50):.3f} s"
  rows = [
      common.Row("isolated runs/s", rps_pool, rps_do, "runs/s", True, note),
      common.Row("p50 latency", med(lat_pool), med(lat_do), "s", False),
      common.Row("p99 latency", pct(lat_pool, 99), pct(lat_do, 99), "s", False),
      common.Row("host CPU per run", cpu_pool, cpu_do, "s", False,
                 f"plain subprocess {cpu_sub:.4f} s"),
      common.Row("projected runs/s on 2 idle cores", 2 / cpu_pool, 2 / cpu_do, "runs/s", True,
                 f"2 / CPU per run; plain subprocess {2 / cpu_sub:.1f}"),
      common.Row("fresh container per run (reuse=1): runs/s", rps_one, rps_do, "runs/s", True,
                 f"p50 {med(lat_one):.3f} s, p99 {pct(lat_one, 99):.3f} s, "
                 f"CPU {cpu_one:.3f} s/run"),
      common.Row("pool runs/s vs plain subprocess", rps_pool, rps_sub, "runs/s", True, floor),
  ]
  if session:
    ses, one = session
    rows.append(common.Row("session run vs one-shot run: latency", ses, one, "s", False,
                           f"one at a time, {a.session_runs} runs, sessions of 8 (open and "
                           "closing reset counted in)"))
  if fresh:
    rows.append(common.Row("cold start: fresh boot vs checkpoint restore", med(fresh),
                           med(restored), "s", False,
                           f"median of {a.restore}; boot + `true` vs restore + `true`"))
  return rows
