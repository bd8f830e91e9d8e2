"""A warm pool of gVisor sandboxes, and the run / async / batch API.

A run takes a booted container whose launcher is already waiting (so the
caller never waits for a boot while the pool keeps up). Inside it the run gets
a clean state: fresh mount and IPC namespaces, fresh size-limited tmpfs
/sandbox, /tmp and /dev/shm, and every process it started (with its sockets)
is killed and reaped before its verdict is returned. A container whose run ended cleanly
(ok or error: the program exited and reported) goes back to the pool, at most
`reuse` runs in all; one that misbehaved (timeout, output flood, OOM, crash,
infra failure) is killed, never reused. A background thread boots
replacements. Containers are keyed by the limits baked into their OCI spec
(Limits.spec_key); every distinct key gets `size` warm containers.

Why not a fresh container per run, or checkpoint/restore: a boot costs ~0.3 s
of host CPU under the ptrace platform, restore costs a boot plus loading the
image, and the 2-core target (>= 25 isolated runs/s) leaves ~0.08 s per run.
A reused container costs ~0.04 s of sandbox CPU per run of a small Python
program: pid 1 is a warm interpreter that forks each run (zygote.py), where a
fresh `python3` alone would cost ~0.065 s (docs/benchmarks.md, ## sandbox).
`reuse=1` gives the strictest mode, a fresh container for every run.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import dataclasses
import os
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

from rlpt.sandbox import bundle
from rlpt.sandbox import launcher
from rlpt.sandbox.container import Container, InfraError, drain, retire
from rlpt.sandbox.result import ExecResult, Limits
from rlpt.sandbox.session import SandboxSession


def default_env() -> dict[str, str]:
  """The whole environment of a sandboxed program unless the caller passes more."""
  return bundle.boot_env()


@dataclasses.dataclass
class PoolStats:
  warm_hits: int = 0      # runs that found a booted container waiting
  cold_boots: int = 0     # runs that had to boot their own
  boots: int = 0          # containers booted by the pool in the background
  boot_failures: int = 0
  runs: int = 0


class SandboxPool:
  """`size` ready sandboxes per limits key, refilled in the background.

  reuse: runs one container may serve (each on a clean state, see the module
  docstring); 1 = a fresh container per run. A container that misbehaved is
  always destroyed. `close()` (also at interpreter exit) destroys them all.
  Containers running a request count towards `size` (they come back), except
  those within `prefetch` runs of their reuse limit: their replacements boot
  early, in the background, at a low CPU weight (Container(background=True)).
  """

  def __init__(self, size: int = 2, *, reuse: int = 32, boot_timeout_s: float = 60.0):
    if size < 0:
      raise ValueError(f"SandboxPool size must be >= 0, got {size}")
    if reuse < 1:
      raise ValueError(f"SandboxPool reuse must be >= 1, got {reuse}")
    self.reuse = reuse
    bundle.runsc_path()  # fail early, with install instructions
    self.size = size
    self.boot_timeout_s = boot_timeout_s
    self.stats = PoolStats()
    self._ready: dict[tuple, collections.deque[Container]] = collections.defaultdict(
        collections.deque)
    self._booting: collections.Counter = collections.Counter()
    self._boot_list: dict[tuple, list[Container]] = collections.defaultdict(list)
    self._waiting: collections.Counter = collections.Counter()
    self._leased: dict[tuple, set[Container]] = collections.defaultdict(set)  # running now
    self._cv = threading.Condition()
    self._closed = False
    self._boot_errors: collections.Counter = collections.Counter()
    _POOLS.add(self)

  # ---- warm containers ------------------------------------------------------
  def warm(self, limits: Limits | None = None, *, wait: bool = False) -> None:
    """Starts booting up to `size` containers for `limits`; with `wait`, blocks
    until they are ready."""
    limits = limits or Limits()
    with self._cv:
      self._top_up(limits)
      if wait:
        deadline = time.monotonic() + self.boot_timeout_s
        while (len(self._ready[limits.spec_key]) < self.size and self._booting[limits.spec_key]
               and time.monotonic() < deadline):
          for b in self._boot_list[limits.spec_key]:
            b.boost()  # someone waits for these: full CPU weight
          self._cv.wait(0.1)

  @property
  def capacity(self) -> int:
    """Runs this pool serves at once from warm containers, per limits key (`size`;
    with size 0, where every run boots its own, the host's cores)."""
    return self.size if self.size > 0 else max(1, os.cpu_count() or 1)

  @property
  def prefetch(self) -> int:
    """Runs before its reuse limit at which a container's replacement starts
    booting (0 for small `reuse`)."""
    return min(8, self.reuse // 4) if self.reuse >= 16 else 0

  def ready_count(self, limits: Limits | None = None) -> int:
    with self._cv:
      return len(self._ready[(limits or Limits()).spec_key])

  def _top_up(self, limits: Limits) -> None:
    key = limits.spec_key
    if self._closed or self.size == 0:  # size 0: every run boots its own container
      return
    # Back off after repeated boot failures so a broken runsc does not spin.
    # Enough for every waiting caller, and `size` in all counting those now
    # running a request (they come back when their run ends cleanly).
    have = len(self._ready[key]) + self._booting[key]
    # A container within `prefetch` runs of its reuse limit counts as gone already,
    # so its replacement boots while it still serves (no caller waits for a boot).
    near_end = self.reuse - self.prefetch
    lasting = (have - sum(c.runs >= near_end for c in self._ready[key])
               + sum(c.runs < near_end for c in self._leased[key]))
    missing = max(self._waiting[key] - have, self.size - lasting)
    if self._boot_errors[key] >= 3:
      missing = min(missing, 1 - self._booting[key])
    for _ in range(max(0, missing)):
      self._booting[key] += 1
      threading.Thread(target=self._boot, args=(limits,), daemon=True,
                       name="rlpt-sandbox-boot").start()

  def _boot(self, limits: Limits) -> None:
    key = limits.spec_key
    c = None
    try:
      if self._boot_errors[key] >= 3:
        time.sleep(min(5.0, 0.2 * self._boot_errors[key]))
      # At a low CPU weight: running sandboxes come first, unless a caller waits.
      c = Container(limits, background=True)
      with self._cv:
        self._boot_list[key].append(c)
        if self._waiting[key]:
          c.boost()
      c.wait_ready(self.boot_timeout_s)
    except Exception:  # noqa: BLE001 -- recorded; the acquirer boots its own and reports
      if c is not None:
        c.kill()
      c = None
    with self._cv:
      self._boot_list[key] = [b for b in self._boot_list[key] if b.alive and not b.ready]
      late = c is not None and self._closed  # booted after close(): ours to end
      if not late:
        self._booting[key] -= 1
      if c is not None:
        self._boot_errors[key] = 0
        self.stats.boots += 1
        if not late:
          self._ready[key].append(c)
      else:
        self._boot_errors[key] += 1
        self.stats.boot_failures += 1
      self._cv.notify_all()
    if late:
      # Still counted as booting, so close() keeps waiting until it is gone (it used to
      # return while this kill was running: a clean-clone `make test` found the
      # container and its `runsc delete` still on the host).
      c.kill()
      with self._cv:
        self._booting[key] -= 1
        self._cv.notify_all()

  def _acquire(self, limits: Limits) -> Container:
    key = limits.spec_key
    deadline = time.monotonic() + self.boot_timeout_s
    with self._cv:
      if self._closed:
        raise RuntimeError("SandboxPool is closed")
      self._waiting[key] += 1
      try:
        while True:
          while self._ready[key]:
            c = self._ready[key].popleft()
            if c.alive:
              self.stats.warm_hits += 1
              self._leased[key].add(c)
              return c
            threading.Thread(target=c.kill, daemon=True).start()
          # Wait for a boot in flight (ours is counted in _waiting) unless none is.
          self._top_up(limits)
          for b in self._boot_list[key]:
            b.boost()
          if (self.size == 0 or self._booting[key] + len(self._leased[key]) == 0
              or time.monotonic() > deadline):
            break
          self._cv.wait(0.05)
      finally:
        self._waiting[key] -= 1
        self._top_up(limits)
    self.stats.cold_boots += 1
    c = Container(limits)
    try:
      c.wait_ready(self.boot_timeout_s)
    except BaseException:
      c.kill()
      raise
    with self._cv:
      self._leased[key].add(c)
    return c

  def _release(self, c: Container, limits: Limits) -> None:
    """Back to the ready queue if its run ended cleanly and it has runs left;
    otherwise ended (gracefully, or it was already killed)."""
    key = limits.spec_key
    with self._cv:
      self._leased[key].discard(c)
      keep = (c.reusable and c.runs < self.reuse and self.size > 0 and not self._closed
              and c.alive)
      if keep:
        self._ready[key].appendleft(c)
      self._top_up(limits)  # (also: a container near its reuse limit is replaced early)
      self._cv.notify_all()
    if not keep:
      retire(c)

  # ---- running ----------------------------------------------------------------
  def run(self, files: Mapping[str, str], cmd: Sequence[str], *, timeout_s: float = 10.0,
          memory_mb: int = 512, max_pids: int = 64, max_output_bytes: int = 1_000_000,
          network: bool = False, env: Mapping[str, str] | None = None, disk_mb: int = 64,
          retries: int = 1) -> ExecResult:
    """Runs `cmd` on a clean state (fresh tmpfs working dir /sandbox holding
    `files`, fresh /tmp, no process of any earlier run) in a warm sandbox.

    env: added to (and overriding) default_env(); nothing else is inherited.
    retries: how many times an infra_error is retried on a new sandbox (no other
    status is retried: it would repeat).
    """
    if network:
      raise NotImplementedError(
          "rlpt.sandbox.run(network=True) is not supported here: runsc's netstack needs a "
          "network namespace with its own interfaces (runsc refuses the host's root "
          "namespace, measured), and none is set up; sandboxed programs run without network")
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_pids=max_pids,
                    max_output_bytes=max_output_bytes, network=network, disk_mb=disk_mb)
    files = dict(files)
    launcher.check_files(files)
    full_env = {**default_env(), **(env or {})}
    launcher.encode_request(files, list(cmd), full_env, {})  # validate cmd/env now
    result = None
    for _ in range(retries + 1):
      try:
        c = self._acquire(limits)
      except InfraError as e:
        result = ExecResult("infra_error", None, "", "", 0.0, reason=str(e))
        continue
      try:
        result = c.execute(files, list(cmd), full_env, limits)
      except BaseException:
        c.kill()
        raise
      finally:
        with self._cv:
          self.stats.runs += 1
        self._release(c, limits)
      if result.status != "infra_error":
        return result
    return result

  def session(self, *, timeout_s: float = 10.0, memory_mb: int = 512, max_pids: int = 64,
              max_output_bytes: int = 1_000_000, disk_mb: int = 64,
              env: Mapping[str, str] | None = None) -> SandboxSession:
    """A sandbox held for one episode: /sandbox persists from run to run until
    `close()` resets it (rlpt.sandbox.session). timeout_s: each run's default
    deadline; the other limits fix the container, as for `run`."""
    if self._closed:
      raise RuntimeError("SandboxPool is closed")
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_pids=max_pids,
                    max_output_bytes=max_output_bytes, disk_mb=disk_mb)
    return SandboxSession(self, limits, env)

  async def run_async(self, files: Mapping[str, str], cmd: Sequence[str],
                      **kwargs: Any) -> ExecResult:
    """`run` without blocking the event loop (it runs on a worker thread)."""
    return await asyncio.to_thread(self.run, files, cmd, **kwargs)

  def run_batch(self, requests: Iterable[Mapping[str, Any]], *, max_concurrency: int = 4
                ) -> list[ExecResult]:
    """Runs many requests (each a dict of `run` arguments: files, cmd, and any
    keyword), at most `max_concurrency` at once; results in request order."""
    reqs = [dict(r) for r in requests]
    for i, r in enumerate(reqs):
      if "files" not in r or "cmd" not in r:
        raise ValueError(f"run_batch request {i} needs 'files' and 'cmd', got keys {sorted(r)}")
    if max_concurrency < 1:
      raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    with concurrent.futures.ThreadPoolExecutor(max_concurrency,
                                               thread_name_prefix="rlpt-sandbox") as ex:
      futs = [ex.submit(self.run, r.pop("files"), r.pop("cmd"), **r) for r in reqs]
      return [f.result() for f in futs]

  def close(self, timeout_s: float = 30.0) -> None:
    """Destroys every warm container and waits for retired ones to be gone."""
    with self._cv:
      self._closed = True
      spare = [c for q in self._ready.values() for c in q]
      self._ready.clear()
      deadline = time.monotonic() + timeout_s
      while sum(self._booting.values()) and time.monotonic() < deadline:
        self._cv.wait(0.1)
    for c in spare:
      c.kill()
    drain(max(0.0, deadline - time.monotonic()))
    _POOLS.discard(self)

  def __enter__(self) -> "SandboxPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


_POOLS: set[SandboxPool] = set()
_default: SandboxPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
  """The process-wide pool behind rlpt.sandbox.run: warm sandboxes per limits key,
  one per two cores between 2 and 16 (2 on a 2-core machine; RLPT_SANDBOX_POOL_SIZE
  overrides). Its size is also how many sandboxed verifications run at once
  (SandboxPool.capacity, rlpt.rewards.registry)."""
  global _default
  with _default_lock:
    if _default is None or _default._closed:
      size = max(2, min(16, (os.cpu_count() or 2) // 2))
      _default = SandboxPool(int(os.environ.get("RLPT_SANDBOX_POOL_SIZE", str(size))))
    return _default


@atexit.register
def _close_all() -> None:
  for p in list(_POOLS):
    try:
      p.close(timeout_s=10.0)
    except Exception:  # noqa: BLE001 -- best effort at exit
      pass
