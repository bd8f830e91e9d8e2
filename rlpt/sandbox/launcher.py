"""The program that runs as pid 1 inside every sandbox, and its wire format.

A warm sandbox boots with the launcher waiting on stdin, so a request costs no
boot. Protocol (host <-> launcher, over the container's stdio pipes):

  launcher -> stdout   READY (one NUL byte) once it runs
  host     -> stdin    request frames: 16 hex digits of length, then JSON
                       {"files": {relpath: text}, "cmd": [...], "env": {...},
                        "rlimits": {...}, "uid": n, "nonce": hex, "disk_mb": n,
                        "workdir": "/sandbox", "tmpfs": [paths]}
  launcher             forks; the child enters fresh mount and IPC
                       namespaces, mounts fresh tmpfs over /sandbox, /tmp and
                       /dev/shm, lowers its rlimits, drops to the unprivileged
                       uid, writes the files, points stdin at /dev/null and
                       execs `cmd` with exactly `env`; pid 1 reaps every process
                       until the child is gone, SIGKILLs whatever the program
                       left behind, reaps those, then
  launcher -> stderr   TRAILER: NUL "rlpt-exit:<nonce>:<code>" NUL, where code is
                       the exit status (negative: killed by that signal),
  and waits for the next frame; EOF on stdin ends it, and with it the
  container. Everything before a trailer is the program's own output.

The launcher is uid 0 of the sandbox (gVisor's, not the host's) holding only
CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_SYS_ADMIN (bundle.LAUNCHER_CAPS), with
noNewPrivileges; the program runs as uid 65534 with no capabilities. That split
is what keeps the program's `kill -9 -1` or `kill -9 1` from reaching pid 1
(measured: with a shared uid, gVisor lets the program SIGKILL pid 1, which ends
the sandbox before it can report).
"""

from __future__ import annotations

import json
import os
import re

READY = b"\x00"
TRAILER_RE = re.compile(rb"\x00rlpt-exit:([0-9a-f]+):(-?\d+)\x00$")
TRAILER_MAX = 64

# Runs under `python3 -I -S` (no site, no env): only the standard library.
SOURCE = r'''
import ctypes, json, os, resource, signal
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWIPC = 0x20000, 0x08000000  # (a new net namespace breaks abstract sockets in gVisor)
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18

def check(rc, what):
  if rc != 0:
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)))

def read_exact(n):
  buf = b""
  while len(buf) < n:
    b = os.read(0, n - len(buf))
    if not b:
      os._exit(0)  # the host is done with this sandbox (or went away)
    buf += b
  return buf

def fresh_namespaces(req):
  check(libc.unshare(NEWNS | NEWIPC), "unshare")
  # Keep the run's mounts out of the launcher's namespace (gVisor without mount
  # propagation answers EINVAL: its mounts are private already).
  if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
    if ctypes.get_errno() != 22:
      check(-1, "mount --make-rprivate /")
  for path in req["tmpfs"]:
    if os.path.isdir(path):
      opts = ("mode=1777,size=%dm" % req["disk_mb"]).encode()
      check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts),
            "mount tmpfs " + path)
  os.chdir(req["workdir"])

def child(req):
  null = os.open("/dev/null", os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  fresh_namespaces(req)
  for name, n in req["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (n, n))
  os.setgroups([])
  os.setgid(req["uid"])
  os.setuid(req["uid"])  # drops every capability; noNewPrivileges is inherited
  if os.getuid() == 0 or os.geteuid() == 0:
    raise SystemExit("rlpt-sandbox: could not drop root")
  for rel, text in req["files"].items():
    d = os.path.dirname(rel)
    if d:
      os.makedirs(d, exist_ok=True)
    with open(rel, "w", encoding="utf-8") as f:
      f.write(text)
  os.setsid()
  os.execvpe(req["cmd"][0], req["cmd"], req["env"])

os.write(1, b"\x00")
while True:
  req = json.loads(read_exact(int(read_exact(16), 16)))
  pid = os.fork()
  if pid == 0:
    try:
      child(req)
    except BaseException as e:
      os.write(2, ("rlpt-sandbox: cannot run %r: %s\n" % (req["cmd"][0], e)).encode())
    os._exit(127)
  code = None
  while code is None:
    try:
      p, status = os.wait()
    except InterruptedError:
      continue
    if p == pid:
      code = os.waitstatus_to_exitcode(status)
  try:
    os.kill(-1, signal.SIGKILL)  # everything the program left behind
  except OSError:
    pass
  while True:
    try:
      os.wait()
    except ChildProcessError:
      break
    except InterruptedError:
      pass
  os.write(2, b"\x00rlpt-exit:%s:%d\x00" % (req["nonce"].encode(), code))
'''


def launcher_args(python: str) -> list[str]:
  return [python, "-I", "-S", "-c", SOURCE]


def check_files(files: dict[str, str]) -> None:
  """Raises ValueError naming the offending entry unless every key is a relative
  path inside the working dir and every value is text."""
  if not isinstance(files, dict):
    raise ValueError(f"sandbox files must be a dict[str, str], got {type(files).__name__}")
  for name, text in files.items():
    if not isinstance(name, str) or not name or name.startswith("/") or "\x00" in name:
      raise ValueError(f"sandbox file name {name!r} must be a non-empty relative path")
    if any(part in ("..", "") for part in name.split("/")) or name.endswith("/"):
      raise ValueError(f"sandbox file name {name!r} must stay inside the working dir "
                       "(no '..', empty or trailing components)")
    if not isinstance(text, str):
      raise ValueError(f"sandbox file {name!r} must be str, got {type(text).__name__}")


def encode_request(files: dict[str, str], cmd: list[str], env: dict[str, str],
                   rlimits: dict[str, int], nonce: str, uid: int = 65534, disk_mb: int = 64,
                   workdir: str = "/sandbox", tmpfs: tuple[str, ...] = ("/sandbox", "/tmp",
                                                                        "/dev/shm")) -> bytes:
  """One request frame: 16 hex digits of length, then the JSON body."""
  if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(c, str) for c in cmd):
    raise ValueError(f"sandbox cmd must be a non-empty list of str, got {cmd!r}")
  for k, v in env.items():
    if not isinstance(k, str) or not isinstance(v, str) or "=" in k or not k:
      raise ValueError(f"sandbox env entry {k!r}={v!r} must be str=str with no '=' in the name")
  body = json.dumps({"files": files, "cmd": list(cmd), "env": env, "rlimits": rlimits,
                     "uid": uid, "nonce": nonce, "disk_mb": int(disk_mb), "workdir": workdir,
                     "tmpfs": list(tmpfs)}).encode()
  return b"%016x" % len(body) + body


def split_trailer(stderr: bytes, nonce: str) -> tuple[bytes, int | None]:
  """(program stderr, exit code) if the launcher's trailer ends `stderr`, else
  (stderr, None)."""
  m = TRAILER_RE.search(stderr[-TRAILER_MAX:])
  if not m or m.group(1).decode() != nonce:
    return stderr, None
  return stderr[:len(stderr) - (m.end() - m.start())], int(m.group(2))
