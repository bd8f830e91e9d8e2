"""The host's side of pid 1 inside every sandbox (zygote.py): boot argv, wire format.

A warm sandbox boots with pid 1 (zygote.py, the same interpreter as the sandbox's
`python3`) waiting with a pre-forked child, so a request costs no boot and, for
`python3 ...` commands, no interpreter start-up. Protocol (host <-> pid 1, over
the container's stdio pipes):

  pid 1 -> stdout   READY (one NUL byte) once it runs
  pid 1 -> stderr   RUN marker: NUL "rlpt-run:<nonce>" NUL, before each run (16 hex
                    digits drawn by pid 1 after it forked the run's child, so no
                    program ever holds it)
  host  -> stdin    a request frame: 16 hex digits of length, then JSON
                    {"files": {relpath: text}, "cmd": [...], "env": {...},
                     "rlimits": {...}, "uid": n, "session": bool, "reset": bool}
  pid 1 -> stderr   TRAILER: NUL "rlpt-exit:<nonce>:<code>" NUL once the program
                    and everything it started are dead (code: exit status,
                    negative for a signal); the next run's marker follows.
Everything between a marker and its trailer is the program's own output. EOF on
stdin ends pid 1, and with it the container. zygote.py says what one run does.

pid 1 is uid 0 of the sandbox (gVisor's, not the host's) holding only CAP_SETUID,
CAP_SETGID, CAP_KILL and CAP_SYS_ADMIN (bundle.LAUNCHER_CAPS), with
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
RUN_RE = re.compile(rb"\x00rlpt-run:([0-9a-f]{16})\x00")
TRAILER_MAX = 64

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py"),
          encoding="utf-8") as _f:
  SOURCE = _f.read()  # pid 1's program, passed with -c


def launcher_args(python: str, *, disk_mb: int, workdir: str = "/sandbox",
                  tmpfs: tuple[str, ...] = ("/sandbox", "/tmp", "/dev/shm")) -> list[str]:
  """pid 1's argv: `python` (the sandbox's `python3`) running zygote.py, which
  mounts fresh `disk_mb` MiB tmpfs over `tmpfs` for every run, in `workdir`."""
  conf = {"disk_mb": int(disk_mb), "workdir": workdir, "tmpfs": list(tmpfs)}
  return [python, "-c", SOURCE, json.dumps(conf)]


class RunStderr:
  """One run's stderr as it arrives from a container's stream.

  Bytes before pid 1's RUN marker (runsc's own messages) are kept, the marker is
  dropped and gives the nonce; the run ends at the trailer carrying that nonce
  (`code` set, `err` the program's stderr), and what follows it (`rest`: the next
  run's marker) belongs to the next run. A program cannot end its run early by
  printing a trailer: it never sees the nonce.
  """

  def __init__(self, carry: bytes = b""):
    self.err = bytearray()
    self.nonce: bytes | None = None
    self.code: int | None = None
    self.rest = b""
    self._trailer: re.Pattern | None = None
    self._scanned = 0
    if carry:
      self.feed(carry)

  def feed(self, data: bytes) -> None:
    self.err += data
    if self.nonce is None:
      m = RUN_RE.search(self.err)
      if m is None:
        return
      self.nonce = m.group(1)
      del self.err[m.start():m.end()]
      self._scanned = m.start()
      self._trailer = re.compile(rb"\x00rlpt-exit:" + self.nonce + rb":(-?\d+)\x00")
    if self.code is None:
      m = self._trailer.search(self.err, max(0, self._scanned - TRAILER_MAX))
      self._scanned = len(self.err)
      if m is not None:
        self.code = int(m.group(1))
        self.rest = bytes(self.err[m.end():])
        del self.err[m.start():]


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
                   rlimits: dict[str, int], uid: int = 65534, *, session: bool = False,
                   reset: bool = False) -> bytes:
  """One request frame: 16 hex digits of length, then the JSON body. session: run in
  the container's persistent /sandbox (a SandboxSession's) instead of a fresh one;
  reset: afterwards, pid 1 replaces that /sandbox with an empty one."""
  if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(c, str) for c in cmd):
    raise ValueError(f"sandbox cmd must be a non-empty list of str, got {cmd!r}")
  for k, v in env.items():
    if not isinstance(k, str) or not isinstance(v, str) or "=" in k or not k:
      raise ValueError(f"sandbox env entry {k!r}={v!r} must be str=str with no '=' in the name")
  body = json.dumps({"files": files, "cmd": list(cmd), "env": env, "rlimits": rlimits,
                     "uid": uid, "session": bool(session), "reset": bool(reset)}).encode()
  return b"%016x" % len(body) + body
