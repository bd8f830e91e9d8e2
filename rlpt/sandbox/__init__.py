"""gVisor (runsc) sandbox for model-written code: limits, warm pool, clean state.

  result = rlpt.sandbox.run({"t.py": "print(1)"}, ["python3", "t.py"], timeout_s=5)
  result.status   # "ok" | "error" | "timeout" | "oom" | "output_limit" | "infra_error"

Every run starts on a clean state in a warm gVisor container: fresh mount and
IPC namespaces, a fresh size-limited tmpfs /sandbox holding `files` (also the
working dir), /tmp and /dev/shm; a read-only root made of the host's /usr,
/lib*, /bin and the project's Python environment (so `python3` imports numpy
and trimesh); no network; uid 65534 with no capabilities and noNewPrivileges;
an environment of only PATH, HOME, LANG and what the caller passes; cgroup
memory / pids / CPU limits and rlimits (CPU time, file size, open files,
processes, core=0); capped stdout/stderr; a host-side wall-clock deadline that
kills the whole container. Every process a run started is killed before its
verdict returns; a container that misbehaved is destroyed, one whose run ended
cleanly serves again (at most SandboxPool.reuse runs; reuse=1: a fresh
container per run). A `python3 FILE|-c|-m` command runs in a fresh fork of the
container's warm interpreter (pid 1, zygote.py) with `python3`'s semantics,
skipping the interpreter's start-up; any other command is exec'd. Only
`infra_error` is retryable (`ExecResult.retryable`), and `run` retries it once
on a new container. `session()` holds one container for a whole episode:
/sandbox persists across its runs and is reset when it closes
(rlpt.sandbox.session).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rlpt.sandbox.bundle import RunscNotFound, runsc_path
from rlpt.sandbox.pool import SandboxPool, default_env, default_pool
from rlpt.sandbox.result import STATUSES, ExecResult, Limits
from rlpt.sandbox.session import SandboxSession, SessionLost

__all__ = ["ExecResult", "Limits", "RunscNotFound", "STATUSES", "SandboxPool", "default_env",
           "default_pool", "run", "run_async", "run_batch", "runsc_path", "SandboxSession",
           "SessionLost", "session"]


def run(files: dict[str, str], cmd: list[str], *, timeout_s: float = 10.0,
        memory_mb: int = 512, max_pids: int = 64, max_output_bytes: int = 1_000_000,
        network: bool = False, **kwargs: Any) -> ExecResult:
  """Runs `cmd` on a clean state in a sandbox from the default warm pool (see
  SandboxPool.run for the extra keywords env, disk_mb, retries)."""
  return default_pool().run(files, cmd, timeout_s=timeout_s, memory_mb=memory_mb,
                            max_pids=max_pids, max_output_bytes=max_output_bytes,
                            network=network, **kwargs)


async def run_async(files: dict[str, str], cmd: list[str], **kwargs: Any) -> ExecResult:
  """`run` for asyncio callers (the default pool, on a worker thread)."""
  return await default_pool().run_async(files, cmd, **kwargs)


def session(**kwargs: Any) -> SandboxSession:
  """A sandbox from the default pool held for one episode (SandboxPool.session)."""
  return default_pool().session(**kwargs)


def run_batch(requests: Iterable[Mapping[str, Any]], *, max_concurrency: int = 4
              ) -> list[ExecResult]:
  """Runs many requests (dicts of `run` arguments) with bounded concurrency."""
  return default_pool().run_batch(requests, max_concurrency=max_concurrency)
