"""OCI bundles for runsc: the read-only root, the mounts, the limits.

Layout on the host (all under `state_dir()`, default /tmp/rlpt-sandbox-<uid>):
  rootfs/       a read-only template root: empty mount points, the symlinks that
                mirror the host's /bin, /lib*, /sbin, and a minimal /etc (no
                shadow, no host users).
  state/        runsc's --root (container state files); only our containers.
  bundles/<id>/ config.json of one container; removed when the container is.

Inside a sandbox: / is the template (read-only); /usr, the Python environment
(sys.prefix, and sys.base_prefix when it lies elsewhere) are read-only bind mounts
at their host paths (so the venv's absolute paths work and `python3` imports
numpy); /sandbox (working dir) and /tmp are fresh size-limited tmpfs mounts;
the program runs as uid/gid 65534 with no capabilities and noNewPrivileges (the
launcher that starts it holds LAUNCHER_CAPS only, inside gVisor; see launcher.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import sys
import threading

from rlpt.sandbox.result import Limits

SANDBOX_UID = 65534
WORKDIR = "/sandbox"
# Memory the sandbox kernel (gVisor's sentry + gofer) needs beside the program: the
# cgroup limit is memory_mb + this.
SENTRY_OVERHEAD_MB = 64
# Host tasks per guest task under the ptrace platform (measured: 32 guest processes
# -> 322 host tasks at rest, an idle sandbox ~41): the host pids cgroup is a backstop
# sized so that the guest's own RLIMIT_NPROC trips first. A fork bomb churns tasks
# faster than the sentry retires their host threads: at 12 per guest the host limit
# tripped first, gVisor's sentry died (runsc exit 2) and the program's fault came back
# as a retryable infra_error; at 32 per guest, 8 of 8 bombs under max_pids=32 ended
# as error / timeout (tests/sandbox/test_attacks.py).
_HOST_TASKS_PER_GUEST = 32
_HOST_TASKS_BASE = 128
# The launcher's only capabilities (inside gVisor): switch the program's uid, kill
# its leftovers, and give each run fresh namespaces and tmpfs mounts.
LAUNCHER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN")
# cgroup cpu.shares of a container booting in the background (a warm pool's refill)
# until it is ready, so a boot mostly takes the CPU that running sandboxes leave (the
# default weight, 1024, is restored once it is, or as soon as a caller waits for
# it). A quarter, not less: the weight also counts against every other process on
# the machine, and a boot starved by those would not be ready when it is needed.
BOOT_CPU_SHARES = 256
DEFAULT_CPU_SHARES = 1024
# Absolute ceiling for RLIMIT_CPU; each run lowers it to its own timeout.
MAX_CPU_SECONDS = 3600

_INSTALL_HINT = ("gVisor's runsc was not found on PATH (nor at /usr/bin/runsc). "
                 "`make test` and `make run` install it; by hand: "
                 "`apt-get update && apt-get install -y runsc` (as root).")


class RunscNotFound(RuntimeError):
  """runsc (gVisor) is not installed."""


@functools.lru_cache(maxsize=None)
def runsc_path() -> str:
  """The runsc binary; raises RunscNotFound with install instructions."""
  path = os.environ.get("RLPT_RUNSC") or shutil.which("runsc")
  if not path and os.access("/usr/bin/runsc", os.X_OK):
    path = "/usr/bin/runsc"
  if not path or not os.access(path, os.X_OK):
    raise RunscNotFound(_INSTALL_HINT)
  return path


def state_dir() -> str:
  return os.environ.get("RLPT_SANDBOX_DIR") or f"/tmp/rlpt-sandbox-{os.getuid()}"


def runsc_root() -> str:
  return os.path.join(state_dir(), "state")


def runsc_argv(*args: str, network: bool = False, root: str | None = None) -> list[str]:
  """A runsc command line on our own state root (`root`, default runsc_root()).

  --platform=ptrace: KVM is present on these VMs but nested KVM hangs the sandbox
  (measured). --file-access-mounts=exclusive: the bind mounts are read-only host
  trees nobody changes while a sandbox lives, so gVisor may cache them instead
  of revalidating every lookup through the gofer (measured: host CPU per pooled
  run of a small Python program 0.125 s -> 0.075 s).
  """
  return [runsc_path(), f"--root={root or runsc_root()}", "--platform=ptrace",
          "--file-access-mounts=exclusive",
          f"--network={'sandbox' if network else 'none'}", *args]


def python_mounts() -> list[str]:
  """Host directories holding the project's Python environment: the venv
  (sys.prefix) and the interpreter it points at (sys.base_prefix), unless that
  already lies under /usr."""
  out = []
  for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(
      os.path.realpath(sys.executable)))):
    p = os.path.realpath(p)
    if p.startswith("/usr/") or p == "/usr" or any(p == q or p.startswith(q + "/") for q in out):
      continue
    out = [q for q in out if not q.startswith(p + "/")] + [p]
  return out


# A host directory under one of these would be hidden inside the sandbox (fresh tmpfs
# or pseudo file systems are mounted there), e.g. a checkout cloned under /tmp: such a
# Python environment is mounted under ENV_ROOT instead, at the same relative path.
ENV_ROOT = "/opt/rlpt-env"
_SHADOWED = ("/tmp", WORKDIR, "/dev", "/proc", "/sys")


def sandbox_path(host_path: str) -> str:
  """Where the host directory or file `host_path` appears inside the sandbox."""
  p = os.path.realpath(host_path)
  if any(p == s or p.startswith(s + "/") for s in _SHADOWED):
    return ENV_ROOT + p
  return p


def python_executable() -> str:
  """The real interpreter binary, as seen inside the sandbox (via python_mounts)."""
  return sandbox_path(sys.executable)


def sandbox_path_env() -> str:
  return f"{sandbox_path(sys.prefix)}/bin:/usr/local/bin:/usr/bin:/bin"


def sandbox_python() -> str:
  """The `python3` that PATH (sandbox_path_env) finds inside the sandbox: the
  project environment's, so site-packages (numpy, trimesh) are on sys.path."""
  return f"{sandbox_path(sys.prefix)}/bin/python3"


def boot_env() -> dict[str, str]:
  """pid 1's environment, and the default one of every sandboxed program."""
  return {"PATH": sandbox_path_env(), "HOME": WORKDIR, "LANG": "C.UTF-8"}


_ETC = {
    "passwd": f"root:x:0:0::/nonexistent:/bin/false\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::"
              f"{WORKDIR}:/bin/false\n",
    "group": f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\n",
    "hosts": "127.0.0.1 localhost\n",
}
_rootfs_lock = threading.Lock()


def rootfs() -> str:
  """Builds (once, atomically) the read-only template root and returns its path."""
  mounts = python_mounts()
  tag = hashlib.sha1("\0".join(f"{m}->{sandbox_path(m)}" for m in mounts).encode()
                     ).hexdigest()[:10]
  path = os.path.join(state_dir(), f"rootfs-{tag}")
  with _rootfs_lock:
    if os.path.isdir(path):
      return path
    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for d in ("proc", "dev", "sys", "tmp", WORKDIR[1:], "usr", "etc"):
      os.makedirs(os.path.join(tmp, d), exist_ok=True)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
      host = "/" + name
      if os.path.islink(host):
        os.symlink(os.readlink(host), os.path.join(tmp, name))
      elif os.path.isdir(host):
        os.makedirs(os.path.join(tmp, name))
    for m in mounts:
      os.makedirs(tmp + sandbox_path(m), exist_ok=True)
    for name, text in _ETC.items():
      with open(os.path.join(tmp, "etc", name), "w") as f:
        f.write(text)
    try:
      os.rename(tmp, path)
    except OSError:  # another process won the race
      shutil.rmtree(tmp, ignore_errors=True)
  return path


def _bind_ro(path: str, destination: str | None = None) -> dict:
  return {"destination": destination or path, "type": "bind", "source": path,
          "options": ["rbind", "ro", "nosuid", "nodev"]}


def _tmpfs(dest: str, size_mb: int) -> dict:
  return {"destination": dest, "type": "tmpfs", "source": "tmpfs",
          "options": ["nosuid", "nodev", "mode=1777", f"size={size_mb}m"]}


def oci_spec(args: list[str], limits: Limits, *, cpu_shares: int = DEFAULT_CPU_SHARES) -> dict:
  """config.json for one container running `args` (pid 1) under `limits`, with
  cgroup `cpu_shares` (its CPU weight against other containers while contended)."""
  root = rootfs()
  binds = ["/usr"] + [f"/{n}" for n in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
                      if os.path.isdir(f"/{n}") and not os.path.islink(f"/{n}")]
  mem = (limits.memory_mb + SENTRY_OVERHEAD_MB) << 20
  rl = lambda kind, n: {"type": kind, "soft": int(n), "hard": int(n)}
  return {
      "ociVersion": "1.0.0",
      "process": {
          # The launcher: gVisor-root with only SETUID/SETGID, so it can drop the
          # program to SANDBOX_UID and stay out of the program's reach.
          "user": {"uid": 0, "gid": 0, "additionalGids": []},
          "args": list(args),
          "env": [f"{k}={v}" for k, v in boot_env().items()],
          "cwd": WORKDIR,
          "noNewPrivileges": True,
          "capabilities": {
              **{k: list(LAUNCHER_CAPS) for k in ("bounding", "effective", "permitted")},
              "inheritable": [], "ambient": []},
          "rlimits": [
              rl("RLIMIT_CPU", MAX_CPU_SECONDS),
              rl("RLIMIT_FSIZE", limits.disk_mb << 20),
              rl("RLIMIT_NOFILE", limits.max_open_files),
              rl("RLIMIT_CORE", 0),
              rl("RLIMIT_NPROC", limits.max_pids),  # counts SANDBOX_UID's tasks
          ],
      },
      "root": {"path": root, "readonly": True},
      "hostname": "sandbox",
      "mounts": [
          {"destination": "/proc", "type": "proc", "source": "proc"},
          {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
          {"destination": "/sys", "type": "sysfs", "source": "sysfs",
           "options": ["nosuid", "noexec", "nodev", "ro"]},
          *[_bind_ro(p) for p in binds],
          *[_bind_ro(p, sandbox_path(p)) for p in python_mounts()],
          _tmpfs("/tmp", limits.disk_mb),
          _tmpfs(WORKDIR, limits.disk_mb),
      ],
      "linux": {
          "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
          "resources": {
              "memory": {"limit": mem, "swap": mem},
              "pids": {"limit": _HOST_TASKS_BASE + _HOST_TASKS_PER_GUEST * limits.max_pids},
              "cpu": {"period": 100_000, "quota": int(math.ceil(limits.cpus * 100_000)),
                      "shares": int(cpu_shares)},
          },
      },
  }


def write_bundle(cid: str, args: list[str], limits: Limits, *,
                 cpu_shares: int = DEFAULT_CPU_SHARES) -> str:
  """Writes <state_dir>/bundles/<cid>/config.json; returns the bundle directory."""
  d = os.path.join(state_dir(), "bundles", cid)
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(oci_spec(args, limits, cpu_shares=cpu_shares), f)
  return d


def set_cpu_shares(cid: str, shares: int) -> bool:
  """Sets the cgroup cpu.shares of container `cid`; False if it has no cpu cgroup."""
  for d in cgroup_dirs(cid):
    path = os.path.join(d, "cpu.shares")
    if os.path.exists(path):
      try:
        with open(path, "w") as f:
          f.write(str(int(shares)))
        return True
      except OSError:
        return False
  return False


def cgroup_dirs(cid: str) -> list[str]:
  """The host cgroup directories runsc creates for container `cid` (cgroup v1:
  one per controller; runsc's default cgroupsPath is /<cid>)."""
  base = "/sys/fs/cgroup"
  try:
    ctrls = sorted(os.listdir(base))
  except OSError:
    return []
  return [os.path.join(base, c, cid) for c in ctrls
          if os.path.isdir(os.path.join(base, c, cid))]
