"""What one sandboxed run returns, and the limits it ran under.

Statuses:
  ok            exited 0
  error         exited non-zero or was killed by a signal it (or its children) sent
  timeout       still running at the host-side wall-clock deadline; the whole
                container was killed
  oom           the sandbox hit its cgroup memory limit and the kernel killed it
  output_limit  stdout or stderr passed `max_output_bytes`; the container was killed
  infra_error   the sandbox itself failed (runsc could not start, crashed, or
                did not answer): says why in `reason`, the only retryable status
"""

from __future__ import annotations

import dataclasses

STATUSES = ("ok", "error", "timeout", "oom", "output_limit", "infra_error")


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """The verdict of one run.

  status:    one of STATUSES.
  exit_code: the program's exit status (negative: killed by that signal number);
             None when the program never finished (timeout, oom, output_limit,
             infra_error).
  stdout, stderr: decoded as UTF-8 (invalid bytes replaced), each at most
             `max_output_bytes` bytes before decoding.
  wall_s:    seconds from handing the request to the sandbox to its verdict
             (excludes waiting for a warm sandbox).
  reason:    a human-readable why for every status other than ok / error.
  """

  status: str
  exit_code: int | None
  stdout: str
  stderr: str
  wall_s: float
  reason: str = ""

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"ExecResult.status must be one of {STATUSES}, got {self.status!r}")

  @property
  def ok(self) -> bool:
    return self.status == "ok"

  @property
  def retryable(self) -> bool:
    """Only an infrastructure failure says nothing about the program: retry it.
    Every other status is the program's own doing and would repeat."""
    return self.status == "infra_error"


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits of one run; the fields that fix a container's OCI spec
  (memory_mb, max_pids, network, disk_mb, cpus) also key the warm pool.

  memory_mb:   cgroup memory for the program and its tmpfs files (the sandbox
               kernel's own overhead, SENTRY_OVERHEAD_MB, is added on top).
  max_pids:    processes + threads the program may have (RLIMIT_NPROC inside
               gVisor; the host pids cgroup is a looser backstop).
  disk_mb:     size of each of the writable tmpfs mounts /sandbox and /tmp.
  cpus:        CPU bandwidth (cgroup cfs quota), in cores.
  timeout_s:   host-side wall-clock deadline; RLIMIT_CPU is ceil(timeout_s) + 1 s.
  max_output_bytes: cap on each of stdout and stderr.
  """

  timeout_s: float = 10.0
  memory_mb: int = 512
  max_pids: int = 64
  max_output_bytes: int = 1_000_000
  network: bool = False
  disk_mb: int = 64
  cpus: float = 1.0
  max_open_files: int = 256

  def __post_init__(self):
    for name in ("timeout_s", "memory_mb", "max_pids", "max_output_bytes", "disk_mb",
                 "cpus", "max_open_files"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f"sandbox limit {name} must be a positive number, got {v!r}")

  @property
  def spec_key(self) -> tuple:
    """The fields baked into a container at boot (a warm sandbox serves only
    requests with the same key)."""
    return (self.memory_mb, self.max_pids, self.network, self.disk_mb, self.cpus,
            self.max_open_files)
