r"""Serving under load: 64 concurrent `openai` clients against a `launch.serve` process,
beside the engine's own offline `generate` on the same requests.

  python -m launch.bench serve [--json=FILE] [--seconds=600] [--clients=64]
                               [--max_tokens=64] [--rss_bound_mib=256]

The server (configs/serve.py: SmolLM2-135M-Instruct, warmed up) runs in its own
process on loopback; the clients are `openai.AsyncOpenAI` instances in this process,
each sending chat completions (temperature 1, a distinct seed per request, chat-formatted
reasoning-gym prompts) one after another until `--seconds` have passed, then the run
stops by itself. Reported: output tokens/s over the whole load phase beside offline
`JaxEngine.generate` on the same prompts and lengths (up to 256 of the requests, in
rounds of 64, the same engine settings, the server stopped first, so the two never
share the cores; ratio >= 0.8 is the goal: the server batches concurrent requests),
p50 / p99 latency of the requests sent in the first and in the last minute (stable when
they agree), errors (goal 0), and the server's resident memory sampled every 15 s from
the end of a warm-up round (one request per client, untimed: it compiles the load's
shapes): the peak of the load's second half may exceed the first half's by at most
`--rss_bound_mib` (a leak keeps growing; the working set of the largest batches rises
once and stays).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from launch.benches import common
from launch.benches.rollout import MODEL, chat_prompts

BASELINE_NAME = "offline generate"


def _start_server(log_path: str, timeout_s: float = 900.0):
  """`python -m launch.serve --config=configs/serve.py` on a free loopback port;
  (Popen, url) once GET /health answers 200."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.Popen([sys.executable, "-m", "launch.serve", "--config=configs/serve.py",
                           f"--port={port}"], cwd=root, stdout=open(log_path, "wb"),
                          stderr=subprocess.STDOUT)
  url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"launch.serve exited with {proc.returncode}; log: {log_path}")
    try:
      with urllib.request.urlopen(url + "/health", timeout=2) as r:
        if r.status == 200:
          return proc, url
    except OSError:
      time.sleep(0.5)
  proc.kill()
  raise RuntimeError(f"launch.serve not healthy within {timeout_s:.0f} s; log: {log_path}")


async def _load(url: str, prompts, *, clients: int, seconds: float, max_tokens: int,
                sample_rss=None):
  """Runs the clients until the deadline; returns ([(t_start, latency_s, tokens)], errors,
  wall seconds, [(t, server RSS MiB)] every 15 s when `sample_rss` is given)."""
  import openai
  done, errors, rss = [], [], []
  t0 = time.monotonic()
  deadline = t0 + seconds

  async def sampler():
    while time.monotonic() < deadline:
      rss.append((time.monotonic() - t0, sample_rss()))
      await asyncio.sleep(15.0)

  async def client(i: int):
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    k = 0
    while time.monotonic() < deadline:
      msgs = list(prompts[(i + k * clients) % len(prompts)])
      ts = time.monotonic()
      try:
        r = await c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=max_tokens,
                                            temperature=1.0, seed=i * 100_003 + k)
        done.append((ts - t0, time.monotonic() - ts, r.usage.completion_tokens))
      except Exception as e:  # noqa: BLE001 -- every failure is counted and reported
        errors.append(f"{type(e).__name__}: {e}"[:200])
      k += 1
    await c.close()

  await asyncio.gather(*(client(i) for i in range(clients)),
                       *([sampler()] if sample_rss else []))
  return done, errors, time.monotonic() - t0, rss


def _offline(prompts, n_requests: int, max_tokens: int) -> tuple[float, int]:
  """Offline generate of `n_requests` of the same prompts (rounds of 64): (s, tokens)."""
  from configs import serve as serve_config
  from rlpt.models import load_model
  from rlpt.rollout import GenerateRequest, JaxEngine, JaxEngineConfig, SamplingParams
  model, tok = load_model(MODEL)
  engine = JaxEngine(model, tok, JaxEngineConfig(**serve_config.get_config().engine.to_dict()))
  reqs = [GenerateRequest(messages=tuple(prompts[i % len(prompts)]), sampling=SamplingParams(
      max_new_tokens=max_tokens, temperature=1.0, seed=i)) for i in range(n_requests)]
  engine.generate(reqs[:64])   # compile the shapes, as the server's warm-up did
  t0, tokens = time.perf_counter(), 0
  for lo in range(0, len(reqs), 64):
    tokens += sum(len(c.token_ids) for c in engine.generate(reqs[lo:lo + 64]))
  return time.perf_counter() - t0, tokens


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench serve")
  p.add_argument("--seconds", type=float, default=600.0)
  p.add_argument("--clients", type=int, default=64)
  p.add_argument("--max_tokens", type=int, default=64)
  p.add_argument("--rss_bound_mib", type=float, default=256.0)
  a = p.parse_args(args)
  import psutil
  prompts = chat_prompts(256)
  log = os.path.join(tempfile.mkdtemp(prefix="bench_serve_"), "serve.log")
  proc, url = _start_server(log)
  try:
    # one untimed round (every client one request at once) compiles the shapes this load
    # uses, so the first minute measures serving, not compiling
    asyncio.run(_load(url, prompts, clients=a.clients, seconds=1e-3, max_tokens=a.max_tokens))
    mib = lambda: psutil.Process(proc.pid).memory_info().rss / 2**20  # noqa: E731
    rss0 = mib()
    done, errors, wall, rss = asyncio.run(_load(url, prompts, clients=a.clients,
                                                seconds=a.seconds, max_tokens=a.max_tokens,
                                                sample_rss=mib))
    rss1 = mib()
  finally:
    proc.terminate()
    try:
      proc.wait(30)
    except subprocess.TimeoutExpired:
      proc.kill()
  tokens = sum(t for _, _, t in done)
  served_tps = tokens / wall
  # throughput is a rate: up to 256 of the same requests (4 rounds of 64) offline
  off_s, off_tokens = _offline(prompts, min(len(done), 256), a.max_tokens)
  first = [lat for t, lat, _ in done if t <= 60.0]           # by when they were sent
  last = [lat for t, lat, _ in done if t >= a.seconds - 60.0]
  rows = [common.Row(f"output tokens/s, {a.clients} clients", served_tps, off_tokens / off_s,
                     "tok/s", note=f"{len(done)} requests, {tokens} tokens in {wall:.0f} s; "
                                   f"goal >= 0.8x")]
  for q in (50, 99):
    rows.append(common.Row(f"p{q} latency, last minute vs first", common.percentile(last, q),
                           common.percentile(first, q), "s", higher_is_better=False,
                           note="ratio ~1 = stable"))
  rows.append(common.Row("errors", float(len(errors)), None, "requests",
                         note=(errors[0] if errors else "goal 0")))
  # A leak grows without end; a working set (KV cache and activations of the largest
  # batches, compiled shapes) rises once and stays: the bound is on the second half's
  # peak over the first half's.
  half = [m for t, m in rss if t < a.seconds / 2] or [rss0]
  later = [m for t, m in rss if t >= a.seconds / 2] + [rss1]
  growth = max(later) - max(half)
  rows.append(common.Row("server RSS peak, 2nd half vs 1st", max(later), max(half), "MiB",
                         higher_is_better=False,
                         note=f"growth {growth:+.0f} MiB, bound {a.rss_bound_mib:.0f} MiB: "
                              + ("within" if growth <= a.rss_bound_mib else "EXCEEDED")
                              + f"; after warm-up {rss0:.0f}; every 15 s: "
                              + " ".join(f"{m:.0f}" for _, m in rss)))
  return rows
