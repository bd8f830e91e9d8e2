"""The program that runs as pid 1 inside every sandbox, and its wire format.

A warm sandbox boots with the launcher waiting on stdin, so a request costs no
boot. Protocol (host <-> launcher, over the container's stdio pipes):

  launcher -> stdout   READY (one NUL byte) once it runs
  host     -> stdin    one JSON request, then EOF:
                       {"files": {relpath: text}, "cmd": [...], "env": {...},
                        "rlimits": {"RLIMIT_CPU": n, ...}, "uid": n, "nonce": hex}
  launcher             forks; the child lowers its rlimits, drops to the
                       unprivileged uid, writes the files
                       under /sandbox, points stdin at /dev/null and execs `cmd`
                       with exactly `env`; pid 1 reaps every process until the
                       child is gone, SIGKILLs whatever the program left
                       behind, reaps those, then
  launcher -> stderr   TRAILER: NUL "rlpt-exit:<nonce>:<code>" NUL, where code is
                       the exit status (negative: killed by that signal),
  and exits, which ends the container. Everything before the trailer is the
  program's own output. The launcher runs as the same unprivileged uid as the
  program and trusts nothing it sends.

The launcher itself is uid 0 of the sandbox (gVisor's, not the host's) holding
only CAP_SETUID, CAP_SETGID and CAP_KILL, with noNewPrivileges: that is what lets it
switch the program to uid 65534 and what keeps the program's `kill -9 -1` or
`kill -9 1` from reaching it (measured: with a shared uid, gVisor lets the
program SIGKILL pid 1, which ends the sandbox before it can report).
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
import json, os, resource, signal
os.write(1, b"\x00")
chunks = []
while True:
  b = os.read(0, 1 << 20)
  if not b:
    break
  chunks.append(b)
if not chunks:
  os._exit(0)  # the host went away before sending a request
req = json.loads(b"".join(chunks))
null = os.open("/dev/null", os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
pid = os.fork()
if pid == 0:
  try:
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
  os.kill(-1, signal.SIGKILL)
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
os._exit(0)
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
                   rlimits: dict[str, int], nonce: str, uid: int = 65534) -> bytes:
  if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(c, str) for c in cmd):
    raise ValueError(f"sandbox cmd must be a non-empty list of str, got {cmd!r}")
  for k, v in env.items():
    if not isinstance(k, str) or not isinstance(v, str) or "=" in k or not k:
      raise ValueError(f"sandbox env entry {k!r}={v!r} must be str=str with no '=' in the name")
  return json.dumps({"files": files, "cmd": list(cmd), "env": env, "rlimits": rlimits,
                     "uid": uid, "nonce": nonce}).encode()


def split_trailer(stderr: bytes, nonce: str) -> tuple[bytes, int | None]:
  """(program stderr, exit code) if the launcher's trailer ends `stderr`, else
  (stderr, None)."""
  m = TRAILER_RE.search(stderr[-TRAILER_MAX:])
  if not m or m.group(1).decode() != nonce:
    return stderr, None
  return stderr[:len(stderr) - (m.end() - m.start())], int(m.group(2))
