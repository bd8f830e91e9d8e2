"""SandboxSession: one gVisor container held for a whole episode.

  with pool.session(memory_mb=256) as s:
    s.run({"solution.py": text}, ["python3", "-c", ""])       # write a file
    r = s.run({}, ["python3", "-m", "pytest", "-q", "test_visible.py"])
    r = s.run({}, ["sh", "-c", "cat solution.py"])             # it is still there

What persists from run to run is /sandbox (the working dir: pid 1's own tmpfs,
which session runs share instead of getting a fresh one each, zygote.py) and
nothing else: each run still gets fresh /tmp, /dev/shm and IPC namespaces, and
every process it started is killed before its verdict returns, so a run
cannot leave a daemon for the next one. `close()` ends the episode: pid 1
replaces /sandbox with an empty tmpfs and the container goes back to its pool,
where the next run or session starts clean (the pool's clean-state guarantee,
extended to sessions); a container whose reset did not end cleanly is destroyed.

When a run kills the container (timeout, OOM, an output flood: the program's own
doing) the episode's files are gone with it; the verdict says so in `reason`,
`lost` counts it, and the next run starts in a fresh, empty /sandbox. An
infrastructure failure (the sandbox itself died) raises SessionLost instead:
the episode cannot go on, and it is not the program's fault.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Mapping, Sequence, TYPE_CHECKING

from rlpt.sandbox import bundle
from rlpt.sandbox import launcher
from rlpt.sandbox.container import Container, InfraError
from rlpt.sandbox.result import ExecResult, Limits

if TYPE_CHECKING:
  from rlpt.sandbox.pool import SandboxPool

# The command of the closing (reset) run: the warm interpreter's no-op.
_NOOP = ["python3", "-c", ""]


class SessionLost(InfraError):
  """The sandbox behind a session died of an infrastructure failure; its files are
  gone. The episode must be retried, never scored."""


@dataclasses.dataclass
class SessionStats:
  runs: int = 0         # runs served (the closing reset not counted)
  lost: int = 0         # containers the program's own runs killed (files lost)
  wall_s: float = 0.0   # summed ExecResult.wall_s of the runs


class SandboxSession:
  """A container leased from `pool` for one episode (see the module docstring).

  limits: the containers' limits; `timeout_s` is each run's default deadline.
  env: added to the pool's default environment for every run.
  """

  def __init__(self, pool: "SandboxPool", limits: Limits, env: Mapping[str, str] | None = None):
    self.pool, self.limits = pool, limits
    self.env = {**bundle.boot_env(), **(env or {})}
    launcher.encode_request({}, _NOOP, self.env, {})  # validate env now
    self.stats = SessionStats()
    self._c: Container | None = None
    self._closed = False
    self._lock = threading.Lock()

  def run(self, files: Mapping[str, str], cmd: Sequence[str], *, timeout_s: float | None = None,
          env: Mapping[str, str] | None = None) -> ExecResult:
    """Writes `files` into /sandbox (over what is there) and runs `cmd` in it.

    timeout_s: this run's wall-clock deadline (default: the session's limits).
    Raises SessionLost on an infrastructure failure, ValueError on a bad request.
    """
    files = dict(files)
    launcher.check_files(files)
    full_env = {**self.env, **(env or {})}
    launcher.encode_request(files, list(cmd), full_env, {})
    limits = self.limits if timeout_s is None else dataclasses.replace(self.limits,
                                                                        timeout_s=timeout_s)
    with self._lock:
      if self._closed:
        raise RuntimeError("SandboxSession is closed")
      if self._c is None:
        try:
          self._c = self.pool._acquire(self.limits)
        except InfraError as e:
          raise SessionLost(f"no sandbox for the session: {e}") from e
      c = self._c
      if not c.alive:
        self._drop(kill=True)
        raise SessionLost("the session's sandbox died between runs")
      try:
        r = c.execute(files, list(cmd), full_env, limits, session=True)
      except BaseException:
        self._drop(kill=True)
        raise
      self.stats.runs += 1
      self.stats.wall_s += r.wall_s
      if r.status == "infra_error":
        self._drop(kill=True)
        raise SessionLost(f"the session's sandbox failed: {r.reason}")
      if not c.alive or not c.reusable:  # the program's timeout / OOM / flood killed it
        self.stats.lost += 1
        self._drop(kill=True)
        r = dataclasses.replace(r, reason=f"{r.reason}; the sandbox was destroyed with every "
                                          "file of the session: the next run starts in an "
                                          "empty /sandbox")
      return r

  def close(self) -> None:
    """Ends the episode: resets /sandbox and returns the container to the pool
    (destroyed instead if the reset does not end cleanly). Idempotent."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
      c = self._c
      if c is None:
        return
      ok = False
      if c.alive and c.reusable:
        try:
          r = c.execute({}, _NOOP, self.env, dataclasses.replace(self.limits, timeout_s=10.0),
                        session=True, reset=True)
          ok = r.status == "ok" and c.reusable
        except Exception:  # noqa: BLE001 -- destroyed below
          ok = False
      self._drop(kill=not ok)

  def _drop(self, *, kill: bool) -> None:
    c, self._c = self._c, None
    if c is None:
      return
    if kill:
      c.reusable = False
      c.kill()
    self.pool._release(c, self.limits)  # (a killed or spent container is retired there)

  def __enter__(self) -> "SandboxSession":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    c = getattr(self, "_c", None)
    if c is not None:  # never closed: its /sandbox was not reset, so it may not serve again
      self._c = None
      c.reusable = False
      self.pool._release(c, self.limits)
