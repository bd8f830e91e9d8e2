"""One gVisor container: boot it, hand it requests, end or kill it.

A container boots (`runsc run` in the foreground, stdio on pipes) with the
launcher waiting for a request. Each request runs in fresh mount and IPC
namespaces with fresh tmpfs /sandbox, /tmp and /dev/shm, and every
process it started is killed before its exit is reported, so a container whose
last run ended cleanly (`reusable`) can serve another; any other outcome
(timeout, output flood, OOM, crash) kills it. The kill path (`kill`) is `runsc kill --all <id> KILL`,
`runsc delete --force <id>`, then SIGKILL of anything still in the container's
host cgroups, then removal of the cgroups and the bundle.
"""

from __future__ import annotations

import atexit
import errno
import os
import queue
import selectors
import shutil
import signal
import subprocess
import threading
import time
import uuid
import weakref

from rlpt.sandbox import bundle
from rlpt.sandbox import launcher
from rlpt.sandbox.result import ExecResult, Limits

_CHUNK = 1 << 16
# How long a finished container may take to exit on its own before it is killed.
_EXIT_GRACE_S = 5.0


class InfraError(RuntimeError):
  """The sandbox (not the program) failed; the message says why."""


def _read_kmsg_for(needle: bytes) -> bool:
  """Whether the kernel log holds `needle` (used to confirm a memcg OOM kill)."""
  try:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
  except OSError:
    return False
  try:
    while True:
      try:
        rec = os.read(fd, 8192)
      except BlockingIOError:
        return False
      except OSError as e:
        if e.errno == errno.EPIPE:  # a record was overwritten while we read
          continue
        return False
      if not rec:
        return False
      if needle in rec:
        return True
  finally:
    os.close(fd)


class Container:
  """A booted (or booting) sandbox under `limits`.

  background: boot at a low CPU weight (bundle.BOOT_CPU_SHARES) so that running
  sandboxes keep the CPU; `boost()` (a caller waits for it) or wait_ready
  restores the default weight.
  """

  def __init__(self, limits: Limits, *, background: bool = False):
    self.limits = limits
    self.cid = f"rlpt-{uuid.uuid4().hex[:16]}"
    self.root = bundle.runsc_root()  # fixed now: the kill path must use the same root
    self._background = background
    self.bundle_dir = bundle.write_bundle(
        self.cid, launcher.launcher_args(bundle.sandbox_python(), disk_mb=limits.disk_mb,
                                         workdir=bundle.WORKDIR), limits,
        cpu_shares=bundle.BOOT_CPU_SHARES if background else bundle.DEFAULT_CPU_SHARES)
    self.started = time.monotonic()
    self._ready = False
    self._dead = False
    self._lock = threading.Lock()
    try:
      self.proc = subprocess.Popen(
          bundle.runsc_argv("run", "--bundle", self.bundle_dir, self.cid,
                            network=limits.network, root=self.root),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          start_new_session=True, close_fds=True)
    except OSError as e:
      shutil.rmtree(self.bundle_dir, ignore_errors=True)
      raise InfraError(f"cannot start runsc: {e}") from e
    for f in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
      os.set_blocking(f.fileno(), False)
    self._carry = b""  # stderr read but not yet a run's: runsc's messages, pid 1's marker
    _LIVE.add(self)
    self.runs = 0
    self.reusable = False  # True after a run that ended cleanly (exit reported)

  def boost(self) -> None:
    """Gives a background boot the default CPU weight (idempotent)."""
    if self._background:
      self._background = False
      bundle.set_cpu_shares(self.cid, bundle.DEFAULT_CPU_SHARES)

  @property
  def ready(self) -> bool:
    return self._ready

  @property
  def alive(self) -> bool:
    return not self._dead and self.proc.poll() is None

  def wait_ready(self, timeout_s: float) -> None:
    """Blocks until the launcher runs inside; raises InfraError if the sandbox
    died or did not come up within `timeout_s`."""
    if self._ready:
      return
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
    sel.register(out, selectors.EVENT_READ)
    sel.register(err, selectors.EVENT_READ)
    try:
      while True:
        left = deadline - time.monotonic()
        if left <= 0:
          raise InfraError(f"sandbox {self.cid} did not boot within {timeout_s:.0f} s")
        for key, _ in sel.select(left):
          try:
            data = os.read(key.fd, 1 if key.fd == out else _CHUNK)
          except BlockingIOError:
            continue
          if key.fd == err:
            if not data:
              sel.unregister(err)
            self._carry = (self._carry + data)[-_CHUNK:]
            continue
          if data == launcher.READY:
            self._ready = True
            self.boost()
            return
          rc = self.proc.poll()
          raise InfraError(f"sandbox {self.cid} failed to boot (runsc exit {rc}): "
                           f"{self._carry[-2000:].decode(errors='replace').strip()}")
    finally:
      sel.close()

  def execute(self, files: dict[str, str], cmd: list[str], env: dict[str, str],
              limits: Limits, *, session: bool = False, reset: bool = False) -> ExecResult:
    """Runs one request in this (ready) container and classifies it. Afterwards
    `reusable` says whether the run ended cleanly (its exit reported, output within
    the cap); every other outcome has already killed the container. session / reset:
    see launcher.encode_request (SandboxSession's runs)."""
    rlimits = {"RLIMIT_CPU": int(limits.timeout_s) + 2}
    payload = memoryview(launcher.encode_request(files, cmd, env, rlimits,
                                                 uid=bundle.SANDBOX_UID, session=session,
                                                 reset=reset))
    self.runs += 1
    self.reusable = False
    cap = limits.max_output_bytes
    out, err = bytearray(), launcher.RunStderr(self._carry)  # (+ runsc's boot messages)
    self._carry = b""
    fin, fout, ferr = (self.proc.stdin.fileno(), self.proc.stdout.fileno(),
                       self.proc.stderr.fileno())
    sel = selectors.DefaultSelector()
    sel.register(fin, selectors.EVENT_WRITE)
    sel.register(fout, selectors.EVENT_READ)
    sel.register(ferr, selectors.EVENT_READ)
    t0 = time.perf_counter()
    deadline = t0 + limits.timeout_s
    killed, code, sent, reading = None, None, 0, 2
    try:
      while reading and killed is None and code is None:
        left = deadline - time.perf_counter()
        if left <= 0:
          killed = "timeout"
          break
        for key, _ in sel.select(left):
          fd = key.fd
          if fd == fin:
            try:
              sent += os.write(fin, payload[sent:sent + _CHUNK])
            except BlockingIOError:
              continue
            except OSError:  # the launcher is gone; EOF on its pipes will tell
              sent = len(payload)
            if sent >= len(payload):
              sel.unregister(fin)
            continue
          try:
            data = os.read(fd, _CHUNK)
          except BlockingIOError:
            continue
          if not data:
            sel.unregister(fd)
            reading -= 1
            continue
          if fd == fout:
            out += data
            if len(out) > cap:
              killed = "output_limit"
          else:
            err.feed(data)
            code = err.code
            if code is None and len(err.err) > cap + launcher.TRAILER_MAX:
              killed = "output_limit"
          if killed or code is not None:
            break
      if code is not None:  # the program and all it started are dead: drain stdout
        while True:
          try:
            data = os.read(fout, _CHUNK)
          except BlockingIOError:
            break
          if not data:
            break
          out += data
          if len(out) > cap:
            break
    finally:
      sel.close()
    wall = time.perf_counter() - t0
    self._carry, err = err.rest, err.err
    text = lambda b: bytes(b[:cap]).decode("utf-8", errors="replace")
    if code is not None and len(out) <= cap:
      self.reusable = sent >= len(payload)
      return ExecResult("ok" if code == 0 else "error", code, text(out), text(err), wall)
    if code is not None or killed == "output_limit":
      self.kill()
      return ExecResult("output_limit", None, text(out), text(err), wall,
                        reason=f"output passed max_output_bytes={cap}; the sandbox was killed")
    if killed == "timeout":
      self.kill()
      return ExecResult("timeout", None, text(out), text(err), wall,
                        reason=f"still running after timeout_s={limits.timeout_s:g}; "
                               "the sandbox was killed")
    # Both pipes closed without the launcher's trailer: the sandbox itself died.
    try:
      rc = self.proc.wait(timeout=_EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
      rc = None
    self.kill()
    if _read_kmsg_for(f"oom_memcg=/{self.cid},".encode()):
      return ExecResult("oom", None, text(out), text(err), wall,
                        reason=f"the memory cgroup limit (memory_mb={limits.memory_mb} + "
                               f"{bundle.SENTRY_OVERHEAD_MB} MiB sandbox overhead) was hit "
                               "and the kernel OOM killer ended the sandbox")
    tail = bytes(err[-1500:]).decode(errors="replace").strip()
    return ExecResult("infra_error", None, text(out), text(err), wall,
                      reason=f"the sandbox ended without reporting the program's exit "
                             f"(runsc exit {rc}): {tail or 'no message'}")

  def kill(self) -> None:
    """Kills everything in the container and removes every trace of it (idempotent)."""
    with self._lock:
      if self._dead:
        return
      self._dead = True
    run = lambda *a, t=10: subprocess.run(bundle.runsc_argv(*a, root=self.root),
                                          stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, timeout=t, check=False)
    try:
      if self.proc.poll() is None:
        run("kill", "--all", self.cid, "KILL", t=5)
      run("delete", "--force", self.cid)
    except (subprocess.TimeoutExpired, OSError):
      pass
    for d in bundle.cgroup_dirs(self.cid):  # backstop: nothing may outlive the container
      try:
        with open(os.path.join(d, "cgroup.procs")) as f:
          for pid in f.read().split():
            try:
              os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
              pass
      except OSError:
        pass
    try:
      self.proc.wait(timeout=_EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self._close_pipes()
    for d in bundle.cgroup_dirs(self.cid):
      for _ in range(50):
        try:
          os.rmdir(d)
          break
        except FileNotFoundError:
          break
        except OSError:
          time.sleep(0.02)
    shutil.rmtree(self.bundle_dir, ignore_errors=True)
    _LIVE.discard(self)

  def _close_pipes(self) -> None:
    for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
      try:
        f.close()
      except (OSError, ValueError):
        pass

  def finish(self) -> None:
    """Ends a container that is done serving: closing its stdin makes the
    launcher exit, and runsc then ends the container on its own; killed if it
    lingers."""
    if self._dead:
      return
    try:
      self.proc.stdin.close()
    except (OSError, ValueError):
      pass
    try:
      self.proc.wait(timeout=_EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
      pass
    if self.proc.returncode is None or bundle.cgroup_dirs(self.cid):
      self.kill()
      return
    with self._lock:
      self._dead = True
    self._close_pipes()
    shutil.rmtree(self.bundle_dir, ignore_errors=True)
    _LIVE.discard(self)


# Every container not yet ended; killed at interpreter exit whoever forgot it.
_LIVE: "weakref.WeakSet[Container]" = weakref.WeakSet()


@atexit.register
def _kill_live() -> None:
  for c in list(_LIVE):
    try:
      c.kill()
    except Exception:  # noqa: BLE001 -- best effort at exit
      pass


# Finished containers are reaped off the caller's critical path.
_retire_q: "queue.Queue[Container]" = queue.Queue()
_retire_thread: threading.Thread | None = None
_retire_lock = threading.Lock()
_pending = 0
_pending_cv = threading.Condition()


def _retirer() -> None:
  global _pending
  while True:
    c = _retire_q.get()
    try:
      c.finish()
    except Exception:  # noqa: BLE001 -- never let the reaper die; fall back to kill
      try:
        c.kill()
      except Exception:  # noqa: BLE001
        pass
    with _pending_cv:
      _pending -= 1
      _pending_cv.notify_all()


def retire(c: Container) -> None:
  """Ends `c` on the reaper thread (a no-op for an already killed container)."""
  global _retire_thread, _pending
  if c._dead:
    return
  with _retire_lock:
    if _retire_thread is None or not _retire_thread.is_alive():
      _retire_thread = threading.Thread(target=_retirer, name="rlpt-sandbox-reaper", daemon=True)
      _retire_thread.start()
  with _pending_cv:
    _pending += 1
  _retire_q.put(c)


def drain(timeout_s: float = 30.0) -> bool:
  """Waits until every retired container is gone; True if all were."""
  deadline = time.monotonic() + timeout_s
  with _pending_cv:
    while _pending:
      left = deadline - time.monotonic()
      if left <= 0:
        return False
      _pending_cv.wait(left)
  return True
