"""A pool of killable worker processes with a timeout per call.

Verifiers that parse untrusted text (sympy via math-verify, reasoning-gym
scorers) can hang or blow up on adversarial input, and math-verify's own timeout
uses SIGALRM, which only works on the main thread. Here every call runs in a
worker process; a call that overruns its budget gets its worker SIGKILLed and
replaced, so the caller always gets an answer within the budget.

Workers come from a forkserver that has run `rlpt.rewards.preload`, so a
replacement starts in tens of milliseconds rather than re-importing sympy and
reasoning-gym, and the (possibly JAX-threaded) parent is never forked.

Each worker holds up to `depth` calls in flight (pipelining hides the IPC round
trip for cheap scorers); a call's clock starts when its worker begins it, i.e.
when the previous result from that worker arrives.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import threading
import time
import traceback
from typing import Any, Callable, Sequence

_PRELOAD = ["rlpt.rewards.preload"]


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one call produced: status "ok" (value set), "timeout" or "error" (error set)."""

  status: str
  value: Any = None
  error: str = ""
  wall_s: float = 0.0


def _worker_main(conn) -> None:
  """Runs (index, fn, args) jobs from `conn` until it closes; replies (index, ok, value)."""
  while True:
    try:
      job = conn.recv()
    except (EOFError, OSError):
      return
    if job is None:
      return
    idx, fn, args = job
    try:
      out = (idx, True, fn(*args))
    except BaseException as e:  # noqa: BLE001 -- a verifier's bug is an outcome, not a crash
      out = (idx, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}")
    try:
      conn.send(out)
    except Exception as e:  # noqa: BLE001 -- e.g. an unpicklable return value
      conn.send((idx, False, f"cannot send result: {type(e).__name__}: {e}"))


class _Worker:
  def __init__(self, ctx):
    self.conn, child = ctx.Pipe(duplex=True)
    self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
    self.proc.start()
    child.close()
    self.inflight: collections.deque[int] = collections.deque()
    self.head_start = 0.0

  def kill(self) -> None:
    try:
      self.proc.kill()
    except Exception:  # noqa: BLE001
      pass
    self.proc.join(timeout=5)
    self.conn.close()

  def close(self) -> None:
    try:
      self.conn.send(None)
    except Exception:  # noqa: BLE001
      pass
    self.proc.join(timeout=2)
    if self.proc.is_alive():
      self.kill()
    else:
      self.conn.close()


class WorkerPool:
  """`num_workers` killable processes; `map` runs calls with a per-call timeout.

  Args:
    num_workers: processes (default: the CPU count).
    depth: calls queued per worker at once (>= 1).
    start_method: multiprocessing start method ("forkserver" by default).
  """

  def __init__(self, num_workers: int | None = None, *, depth: int = 32,
               start_method: str = "forkserver"):
    if depth < 1:
      raise ValueError(f"WorkerPool: depth must be >= 1, got {depth}")
    self.num_workers = num_workers or os.cpu_count() or 1
    self.depth = depth
    self._ctx = mp.get_context(start_method)
    if start_method == "forkserver":
      self._ctx.set_forkserver_preload(_PRELOAD)
    self._workers: list[_Worker] = []
    self._lock = threading.Lock()
    self.kills = 0  # workers killed for overrunning (diagnostics)

  def _ensure_workers(self) -> None:
    self._workers = [w for w in self._workers if w.proc.is_alive()]
    while len(self._workers) < self.num_workers:
      self._workers.append(_Worker(self._ctx))

  def map(self, calls: Sequence[tuple[Callable, tuple]], timeout_s: float | Sequence[float]
          ) -> list[Outcome]:
    """Runs every `fn(*args)` of `calls`; returns one Outcome per call, in order.

    `timeout_s` (seconds, one for all or one per call) bounds each call's own run
    time; an overrunning call's worker is killed and the call reports "timeout".
    """
    n = len(calls)
    timeouts = ([float(timeout_s)] * n if isinstance(timeout_s, (int, float))
                else [float(t) for t in timeout_s])
    if len(timeouts) != n:
      raise ValueError(f"WorkerPool.map: {len(timeouts)} timeouts for {n} calls")
    results: list[Outcome | None] = [None] * n
    if n == 0:
      return []
    with self._lock:
      self._ensure_workers()
      pending = collections.deque(range(n))
      done = 0
      while done < n:
        for w in self._workers:  # fill every worker's pipeline
          while pending and len(w.inflight) < self.depth:
            idx = pending.popleft()
            fn, args = calls[idx]
            try:
              w.conn.send((idx, fn, args))
            except Exception as e:  # noqa: BLE001 -- unpicklable job or dead worker
              results[idx] = Outcome("error", error=f"cannot send job: {type(e).__name__}: {e}")
              done += 1
              continue
            if not w.inflight:
              w.head_start = time.monotonic()
            w.inflight.append(idx)
        busy = [w for w in self._workers if w.inflight]
        if not busy:
          continue
        now = time.monotonic()
        wait_s = max(0.0, min(w.head_start + timeouts[w.inflight[0]] - now for w in busy))
        ready = mp_connection.wait([w.conn for w in busy], timeout=wait_s)
        now = time.monotonic()
        for w in list(busy):
          if w.conn in ready:
            while w.inflight:  # drain every reply already there (one wake-up, many results)
              try:
                idx, ok, value = w.conn.recv()
              except (EOFError, OSError):  # the worker died (e.g. a C-level crash or OOM)
                head = w.inflight.popleft()
                results[head] = Outcome("error", error="worker process died",
                                        wall_s=now - w.head_start)
                done += 1
                self._replace(w, pending)
                break
              w.inflight.remove(idx)
              results[idx] = (Outcome("ok", value=value, wall_s=now - w.head_start) if ok else
                              Outcome("error", error=value, wall_s=now - w.head_start))
              done += 1
              w.head_start = now
              if not w.conn.poll():
                break
          elif now >= w.head_start + timeouts[w.inflight[0]]:
            head = w.inflight.popleft()
            results[head] = Outcome("timeout", error=f"exceeded {timeouts[head]:.3g} s",
                                    wall_s=now - w.head_start)
            done += 1
            self.kills += 1
            self._replace(w, pending)
    return results  # type: ignore[return-value]

  def _replace(self, w: _Worker, pending: collections.deque) -> None:
    """Kills `w`, puts its other in-flight calls back at the front, starts a fresh worker."""
    pending.extendleft(reversed(w.inflight))
    w.inflight.clear()
    w.kill()
    self._workers[self._workers.index(w)] = _Worker(self._ctx)

  def call(self, fn: Callable, args: tuple, timeout_s: float) -> Outcome:
    """One call with a timeout (see `map`)."""
    return self.map([(fn, args)], timeout_s)[0]

  def close(self) -> None:
    with self._lock:
      for w in self._workers:
        w.close()
      self._workers = []

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


_DEFAULT: WorkerPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> WorkerPool:
  """The process-wide pool the reward registry uses (created on first use)."""
  global _DEFAULT
  with _DEFAULT_LOCK:
    if _DEFAULT is None:
      _DEFAULT = WorkerPool()
    return _DEFAULT
