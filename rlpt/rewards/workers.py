"""A pool of killable worker processes with a timeout per call.

Verifiers that parse untrusted text (sympy via math-verify, reasoning-gym
scorers) can hang or blow up on adversarial input, and math-verify's own timeout
uses SIGALRM, which only works on the main thread. Here every call runs in a
worker process; a call that overruns its budget gets its worker SIGKILLed and
replaced, so the caller always gets an answer within the budget.

Workers come from a forkserver that has run `rlpt.rewards.preload`, so a
replacement starts in tens of milliseconds rather than re-importing sympy and
reasoning-gym, and the (possibly JAX-threaded) parent is never forked.

Calls travel in chunks (one pipe message each way per chunk) and a call's clock
starts when its worker begins it, which the worker publishes in shared memory.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import threading
import time
import traceback
from typing import Any, Callable, Sequence

_PRELOAD = ["rlpt.rewards.preload"]


class PoolUnavailable(RuntimeError):
  """The pool cannot run anything: its worker processes die before they start a job
  (for instance the forkserver cannot re-import a `__main__` read from stdin). An
  infrastructure failure, never an outcome of the calls."""


# Fresh workers dying before their first job, in a row, before the pool gives up.
MAX_STARTUP_DEATHS = 3
# Deaths of a worker while running one call before that call is reported as "error"
# (the first is retried on a fresh worker: a death once may be the machine's doing).
MAX_CALL_DEATHS = 2


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one call produced: status "ok" (value set), "timeout" or "error" (error set)."""

  status: str
  value: Any = None
  error: str = ""
  wall_s: float = 0.0


def _worker_main(conn, state) -> None:
  """Runs chunks of (index, fn, args) jobs from `conn` until it closes.

  Before each job it writes (index, start time) into the shared `state`, so the
  parent can time the job without a message; after the chunk it sends back one
  list of (index, ok, value, seconds).
  """
  while True:
    try:
      chunk = conn.recv()
    except (EOFError, OSError):
      return
    if chunk is None:
      return
    out = []
    for idx, fn, args in chunk:
      t0 = time.monotonic()
      state[1] = t0
      state[0] = float(idx)
      try:
        out.append((idx, True, fn(*args), time.monotonic() - t0))
      except BaseException as e:  # noqa: BLE001 -- a verifier's bug is an outcome, not a crash
        out.append((idx, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}",
                    time.monotonic() - t0))
    state[0] = -1.0
    try:
      conn.send(out)
    except Exception:  # noqa: BLE001 -- e.g. an unpicklable return value: send what pickles
      safe = []
      for idx, ok, value, secs in out:
        try:
          pickle.dumps(value)
          safe.append((idx, ok, value, secs))
        except Exception as e:  # noqa: BLE001
          safe.append((idx, False, f"cannot send result: {type(e).__name__}: {e}", secs))
      conn.send(safe)


class _Worker:
  def __init__(self, ctx):
    self.conn, child = ctx.Pipe(duplex=True)
    self.state = ctx.Array("d", [-1.0, 0.0], lock=False)  # (job index or -1, its start time)
    self.proc = ctx.Process(target=_worker_main, args=(child, self.state), daemon=True)
    self.proc.start()
    child.close()
    self.chunks: collections.deque[list[int]] = collections.deque()

  def current(self) -> tuple[int, float]:
    """(index of the job the worker is running or -1, when it started)."""
    idx = int(self.state[0])
    return idx, float(self.state[1])

  @property
  def started_a_job(self) -> bool:
    return float(self.state[1]) != 0.0

  def exit_code(self) -> int | None:
    self.proc.join(timeout=1)
    return self.proc.exitcode

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

  Calls go to workers in chunks (one message each way per chunk, so cheap calls
  are not dominated by pipe round trips); each worker publishes which call it is
  running and since when through shared memory, which is how a single overrunning
  call is found and timed out. The other calls of a killed worker's chunks are
  run again on its replacement.

  Args:
    num_workers: processes (default: the CPU count).
    max_chunk: most calls per message.
    start_method: multiprocessing start method ("forkserver" by default). As with
      any multiprocessing code, the main module must be import-safe
      (`if __name__ == "__main__":`): workers import it.
  """

  def __init__(self, num_workers: int | None = None, *, max_chunk: int = 64,
               start_method: str = "forkserver"):
    if max_chunk < 1:
      raise ValueError(f"WorkerPool: max_chunk must be >= 1, got {max_chunk}")
    self.num_workers = num_workers or os.cpu_count() or 1
    self.max_chunk = max_chunk
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
      deaths = collections.Counter()   # call index -> workers that died running it
      startup_deaths = 0               # fresh workers dead before a first job, in a row

      def startup_death(w: _Worker) -> None:
        """A worker that died before running any job (seen on a send or a read): the
        pool's failure, never the calls'; MAX_STARTUP_DEATHS in a row raise."""
        nonlocal startup_deaths
        startup_deaths += 1
        if startup_deaths >= MAX_STARTUP_DEATHS:
          code = w.exit_code()
          self._replace(w, pending, skip=None, restart=False)
          self._kill_all()
          raise PoolUnavailable(
              f"verifier worker processes die before running any job "
              f"({startup_deaths} in a row, last exit code {code}); with the "
              "forkserver start method the main module must be importable and "
              "import-safe (a script file with `if __name__ == \"__main__\":`, "
              "not code read from stdin); see the worker's traceback above")
        self._replace(w, pending, skip=None)

      while done < n:
        for w in self._workers:  # keep two chunks per worker: one running, one queued
          while pending and len(w.chunks) < 2:
            size = max(1, min(self.max_chunk, -(-len(pending) // (2 * len(self._workers)))))
            idxs = [pending.popleft() for _ in range(min(size, len(pending)))]
            try:
              w.conn.send([(i, calls[i][0], calls[i][1]) for i in idxs])
              w.chunks.append(idxs)
            except OSError:  # its pipe is closed: the worker died, not the jobs' fault
              pending.extendleft(reversed(idxs))
              if not w.started_a_job:
                startup_death(w)
              elif not w.chunks:  # nothing of it running to blame: just replace it
                self._replace(w, pending, skip=None)
              break  # a worker with chunks is handled as a death where they are read
            except Exception as e:  # noqa: BLE001 -- unpicklable job: fail it alone
              if len(idxs) == 1:
                results[idxs[0]] = Outcome("error", error=f"cannot send job: {type(e).__name__}: {e}")
                done += 1
              else:
                for k, i in enumerate(idxs):  # retry one by one to find the bad one(s)
                  try:
                    w.conn.send([(i, calls[i][0], calls[i][1])])
                    w.chunks.append([i])
                  except OSError:  # the worker died meanwhile: the rest go back
                    pending.extendleft(reversed(idxs[k:]))
                    break
                  except Exception as e1:  # noqa: BLE001
                    results[i] = Outcome("error",
                                         error=f"cannot send job: {type(e1).__name__}: {e1}")
                    done += 1
        busy = [w for w in self._workers if w.chunks]
        if not busy:
          continue
        now = time.monotonic()
        wait_s = 0.05  # re-read the shared clocks at least this often
        for w in busy:
          cur, t0 = w.current()
          if cur >= 0:
            wait_s = min(wait_s, max(0.0, t0 + timeouts[cur] - now))
        ready = mp_connection.wait([w.conn for w in busy], timeout=wait_s)
        now = time.monotonic()
        for w in list(busy):
          if w.conn in ready:
            try:
              got = w.conn.recv()
            except (EOFError, OSError):  # the worker died (a C-level crash, OOM, os._exit)
              if not w.started_a_job:  # it never ran anything: the pool's failure
                startup_death(w)
                continue
              startup_deaths = 0
              cur, t0 = w.current()
              bad = cur if cur >= 0 else w.chunks[0][0]
              deaths[bad] += 1
              if deaths[bad] >= MAX_CALL_DEATHS:
                results[bad] = Outcome("error", error=f"worker process died running this "
                                       f"call ({deaths[bad]} times, exit code "
                                       f"{w.exit_code()})", wall_s=now - t0)
                done += 1
                self._replace(w, pending, skip=bad)
              else:
                self._replace(w, pending, skip=None)
              continue
            startup_deaths = 0
            w.chunks.popleft()
            for idx, ok, value, secs in got:
              results[idx] = (Outcome("ok", value=value, wall_s=secs) if ok else
                              Outcome("error", error=value, wall_s=secs))
              done += 1
          else:
            cur, t0 = w.current()
            if cur >= 0 and now >= t0 + timeouts[cur]:
              results[cur] = Outcome("timeout", error=f"exceeded {timeouts[cur]:.3g} s",
                                     wall_s=now - t0)
              done += 1
              self.kills += 1
              self._replace(w, pending, skip=cur)
    return results  # type: ignore[return-value]

  def _replace(self, w: _Worker, pending: collections.deque, skip: int | None,
               restart: bool = True) -> None:
    """Kills `w`, puts its calls other than `skip` back at the front, starts a fresh
    worker in its place."""
    redo = [i for chunk in w.chunks for i in chunk if i != skip]
    pending.extendleft(reversed(redo))
    w.chunks.clear()
    w.kill()
    if restart:
      self._workers[self._workers.index(w)] = _Worker(self._ctx)

  def _kill_all(self) -> None:
    for w in self._workers:
      w.kill()
    self._workers = []

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
