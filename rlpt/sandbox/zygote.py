"""The program that runs as pid 1 inside every sandbox: a pre-forking zygote.

Never imported to run on the host: launcher.launcher_args passes this file's text
to `<sandbox python3> -c`, with one JSON argument {"disk_mb", "workdir", "tmpfs"};
it uses only the standard library. (Importing it is harmless: the work happens
under `if __name__ == "__main__"`, so the host's tests can call its helpers.)

pid 1 is the same interpreter a sandboxed `python3` is, started the same way
(site on, the boot environment of bundle.boot_env), so it has already paid for
the interpreter's start-up. It never reads a request itself. For each run it:

  1. forks the run's child C (C's memory is pid 1's: no earlier request, no
     nonce), then draws a fresh nonce N, writes the run marker
     NUL "rlpt-run:N" NUL to stderr and only then lets C go on (a pipe), so
     no program can ever know N and nothing C prints precedes the marker;
  2. C, still root, enters fresh mount and IPC namespaces, mounts fresh tmpfs
     over /tmp and /dev/shm (before the request arrives), reads the request
     frame from stdin, mounts a fresh tmpfs over /sandbox too unless the request
     is a session's (`"session": true`: C keeps pid 1's own /sandbox, which every
     session run shares, so files persist from run to run), acknowledges the
     request to pid 1 (a pipe, closed at once; the byte says whether pid 1 must
     reset the session workdir afterwards), points stdin at /dev/null, lowers its rlimits, drops to the
     unprivileged uid (no capabilities; noNewPrivileges is inherited), writes
     the files, takes exactly the requested environment and then either
       - runs the program in-process when `cmd` is this interpreter as `python3
         FILE ARGS`, `python3 -c CODE ARGS` or `python3 -m MODULE ARGS` (found
         through the request's PATH, no PYTHON* variables, the same locale
         variables as the boot): fresh `__main__`, sys.argv, sys.orig_argv and
         sys.path[0], the modules pid 1 imported for itself dropped from
         sys.modules, then the code with `python3`'s exit semantics (SystemExit
         codes, an uncaught exception's traceback on stderr and exit 1, a syntax
         error without traceback, atexit handlers and non-daemon threads at exit);
       - or execs `cmd` (every other command, and the cases above it does not
         cover: a missing script, options, stdin as the program);
  3. pid 1 reaps every process until C is gone, SIGKILLs whatever the program
     left behind, reaps those, unmounts the run's tmpfs (gVisor shows them in
     pid 1's namespace too: `unmount_since`), writes the trailer NUL "rlpt-exit:N:code" NUL
     (code: exit status, negative for a signal) and goes back to 1. If C found
     EOF on stdin instead of a request (no acknowledgement), pid 1 exits. After a
     request with `"reset": true` (a session's last), pid 1 first unmounts its
     /sandbox and mounts a fresh, empty one, so the next session starts clean
     (a one-shot run never sees pid 1's /sandbox: its own tmpfs covers it).

Why fork a warm interpreter: a fresh `python3` costs ≈0.065 s of sandbox CPU under
gVisor's ptrace platform (mostly site's imports through the gofer); a run in a
fork of this one costs ≈0.035 s in all, most of it gVisor's fork and exit of an
address space (≈0.02 s) and the fresh namespaces and tmpfs (≈0.006 s). Exiting
with os._exit after what `python3` does visibly at exit matters: the
interpreter's own finalization would touch, and so copy, all of pid 1's heap.
What it costs in fidelity (measured against a real `python3`, tests/sandbox/
test_zygote.py): runs in one container share pid 1's str hash seed (as if
PYTHONHASHSEED were fixed per container); /proc/self/cmdline is pid 1's; gc
reports pid 1's objects as frozen; the program runs 4 frames deeper (it hits the
recursion limit 4 calls earlier); sys.modules starts from what `python3` holds
after start-up. What it does not cost in isolation: C is a copy of pid 1, which
holds no secret (never a request, never the nonce of a run still open); C drops
to the sandbox uid before any program code runs, so it can neither signal nor
read pid 1 (root); memory is copy-on-write, so nothing a run does reaches pid 1
or the next run (each starts from a fresh fork of the same pid 1), and the only
descriptors it keeps are stdin (/dev/null), stdout and stderr.
"""

import sys

# What a fresh `python3` holds after start-up (site included): the modules pid 1
# imports beyond these are dropped from a run's sys.modules.
BASE_MODULES = frozenset(sys.modules)

import ctypes  # noqa: E402 -- after BASE_MODULES on purpose
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

READY = b"\x00"
NEWNS, NEWIPC = 0x20000, 0x08000000  # (a new net namespace breaks abstract sockets in gVisor)
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18
MNT_DETACH = 2
# The byte a run's child acknowledges its request with: RESET asks pid 1 for a
# fresh session workdir once the run is over (a session's end).
ACK, ACK_RESET = b"r", b"R"
# Environment variables read while the interpreter starts: a run whose env differs
# in these from pid 1's boot env execs a real `python3` instead.
LOCALE_VARS = ("LANG", "LC_ALL", "LC_CTYPE")


def check(rc, what):
  if rc != 0:
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def mount_tmpfs(conf, path):
  """A fresh conf["disk_mb"] MiB tmpfs over `path` (nothing if it is not a dir)."""
  libc = ctypes.CDLL(None, use_errno=True)  # (dlopen of the loaded libc: a lookup)
  opts = ("mode=1777,size=%dm" % conf["disk_mb"]).encode()
  if os.path.isdir(path):
    check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts),
          "mount tmpfs " + path)


def fresh_namespaces(conf):
  """Fresh mount + IPC namespaces with fresh tmpfs over conf["tmpfs"] except the
  workdir (mounted once the request says whether it is a session's: `child`)."""
  libc = ctypes.CDLL(None, use_errno=True)
  check(libc.unshare(NEWNS | NEWIPC), "unshare")
  # Keep the run's mounts out of pid 1's namespace (gVisor without mount
  # propagation answers EINVAL: its mounts are private already).
  if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
    if ctypes.get_errno() != 22:
      check(-1, "mount --make-rprivate /")
  for path in conf["tmpfs"]:
    if path != conf["workdir"]:
      mount_tmpfs(conf, path)


def mounts():
  """{mount id: mount point} of this process's namespace."""
  with open("/proc/self/mountinfo") as f:
    return {int(line.split()[0]): line.split()[4] for line in f if line.strip()}


def unmount_since(base):
  """pid 1: unmounts every mount not in `base` (ids), newest first. gVisor shows
  the tmpfs a run's child mounted in its own namespace in pid 1's too (measured:
  without this, each run stacked three more tmpfs, with the files of every earlier
  run still held under them), so they are taken down after each run."""
  libc = ctypes.CDLL(None, use_errno=True)
  for mid, path in sorted(mounts().items(), reverse=True):
    if mid not in base:
      check(libc.umount2(path.encode(), MNT_DETACH), "umount " + path)


def reset_workdir(conf):
  """pid 1: replaces the session workdir (pid 1's own tmpfs over conf["workdir"],
  which session runs share) with a fresh, empty one."""
  libc = ctypes.CDLL(None, use_errno=True)
  check(libc.umount2(conf["workdir"].encode(), MNT_DETACH), "umount " + conf["workdir"])
  mount_tmpfs(conf, conf["workdir"])


def read_exact(fd, n):
  """n bytes from fd, or None at EOF."""
  buf = b""
  while len(buf) < n:
    b = os.read(fd, n - len(buf))
    if not b:
      return None
    buf += b
  return buf


def read_request():
  head = read_exact(0, 16)
  body = head and read_exact(0, int(head, 16))
  return None if body is None else json.loads(body)


def drop_privileges(req):
  for name, n in req["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (n, n))
  os.setgroups([])
  os.setgid(req["uid"])
  os.setuid(req["uid"])  # drops every capability; noNewPrivileges is inherited
  if os.getuid() == 0 or os.geteuid() == 0:
    raise SystemExit("rlpt-sandbox: could not drop root")


def write_files(files):
  for rel, text in files.items():
    d = os.path.dirname(rel)
    if d:
      os.makedirs(d, exist_ok=True)
    with open(rel, "w", encoding="utf-8") as f:
      f.write(text)


def which(name, path_env):
  """What execvpe would run for `name` under PATH=path_env (None: nothing)."""
  if "/" in name:
    return name
  for d in (path_env or "").split(":"):
    p = os.path.join(d or ".", name)
    if os.path.isfile(p) and os.access(p, os.X_OK):
      return p
  return None


def python_plan(cmd, env, executable, boot_env):
  """("file" | "-c" | "-m", target, sys.argv) when `cmd` can run in this
  interpreter exactly as `python3` would run it, else None."""
  if len(cmd) < 2 or which(cmd[0], env.get("PATH")) != executable:
    return None
  if any(k.startswith("PYTHON") for k in env):
    return None
  if any(env.get(k) != boot_env.get(k) for k in LOCALE_VARS):
    return None
  opt = cmd[1]
  if opt in ("-c", "-m"):
    if len(cmd) < 3:
      return None
    return opt, cmd[2], [opt] + list(cmd[3:])
  if opt.startswith("-") or not os.path.isfile(opt):
    return None  # options, stdin, a missing script: the real interpreter says it
  return "file", opt, list(cmd[1:])


def fresh_main(plan, cmd):
  """Points sys.* at the program of `plan` as `python3` would; returns the new
  __main__ module and the code object to run in it (None for -m)."""
  import builtins  # noqa: PLC0415
  kind, target, argv = plan
  for name in [m for m in sys.modules if m not in BASE_MODULES]:
    del sys.modules[name]
  sys.argv = argv
  sys.orig_argv = list(cmd)
  mod = type(sys)("__main__")
  mod.__builtins__ = builtins
  mod.__annotations__ = {}
  code = None
  if kind == "file":
    path = os.path.abspath(target)
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    from importlib.machinery import SourceFileLoader  # noqa: PLC0415 -- already loaded
    mod.__file__, mod.__cached__ = path, None
    mod.__loader__ = SourceFileLoader("__main__", path)
    with open(path, "rb") as f:
      source = f.read()
    code = (source, path)
  elif kind == "-c":
    sys.path[0] = ""
    from importlib.machinery import BuiltinImporter  # noqa: PLC0415
    mod.__loader__ = BuiltinImporter
    code = (target, "<string>")
  else:
    sys.path[0] = os.getcwd()
  # Forget what pid 1's import system saw outside the interpreter's own path (its
  # work dir, now a fresh tmpfs).
  for p in [p for p in sys.path_importer_cache if p not in sys.path[1:]]:
    del sys.path_importer_cache[p]
  if kind != "-m":
    sys.modules["__main__"] = mod
  return mod, code


def exit_code_of(e):
  """The exit status `python3` gives an uncaught SystemExit `e` (printing a
  non-integer code to stderr, as it does)."""
  code = e.code
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xff
  try:
    print(code, file=sys.stderr)
  except Exception:  # noqa: BLE001
    pass
  return 1


def finish(code, sigint=False):
  """What `python3` does at exit that a program can see (non-daemon threads
  joined, atexit handlers, stdio flushed: 120 if that fails), then _exit: the
  interpreter's own finalization would touch, and so copy, every page of pid 1's
  heap."""
  try:
    if "threading" in sys.modules:
      sys.modules["threading"]._shutdown()
  except BaseException:  # noqa: BLE001
    pass
  try:
    import atexit  # noqa: PLC0415
    atexit._run_exitfuncs()
  except BaseException:  # noqa: BLE001
    pass
  for f in (sys.stdout, sys.stderr):
    try:
      if f is not None:
        f.flush()
    except BaseException:  # noqa: BLE001
      code = code or 120
  if sigint:  # python3 ends itself with SIGINT after an uncaught KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  os._exit(code)


def run_python(plan, cmd):
  """Runs the program of `plan` in this process like `python3` would, then exits."""
  finish(*run_main(plan, cmd))


def run_main(plan, cmd):
  """Runs the program; returns (exit code, whether python3 would end itself with
  SIGINT: after an uncaught KeyboardInterrupt)."""
  kind = plan[0]
  try:
    mod, code = fresh_main(plan, cmd)
  except Exception as e:  # noqa: BLE001 -- an unreadable script: python3 says the same
    sys.stderr.write("%s: can't open file %r: %s\n" % (cmd[0], plan[1], e))
    return 2, False
  try:
    if kind == "-m":
      import runpy  # noqa: PLC0415
      runpy._run_module_as_main(plan[1])  # what `python3 -m` itself calls
      return 0, False
    try:
      compiled = compile(code[0], code[1], "exec")
    except SyntaxError as e:
      sys.excepthook(type(e), e.with_traceback(None), None)  # python3 prints no traceback
      return 1, False
    exec(compiled, mod.__dict__)  # noqa: S102 -- the sandboxed program itself
  except SystemExit as e:
    return exit_code_of(e), False
  except BaseException as e:  # noqa: BLE001 -- an uncaught exception of the program
    tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
    sys.excepthook(type(e), e.with_traceback(tb), tb)  # the traceback without this frame
    return 1, isinstance(e, KeyboardInterrupt)
  return 0, False


def child(conf, go_r, ack_w, boot_env):
  """C's side of one run: returns (plan, cmd) for an in-process Python run; every
  other outcome ends (exec or _exit) here."""
  what = "?"
  try:
    fresh_namespaces(conf)
    req = read_request()
    if req is None:
      os._exit(0)  # EOF: the host is done with this sandbox; no ack, so pid 1 exits
    if not req.get("session"):
      mount_tmpfs(conf, conf["workdir"])  # a one-shot run: its own fresh workdir
    os.chdir(conf["workdir"])
    os.write(ack_w, ACK_RESET if req.get("reset") else ACK)
    os.close(ack_w)
    if not os.read(go_r, 1):
      os._exit(1)  # pid 1 is gone
    os.close(go_r)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    drop_privileges(req)
    write_files(req["files"])
    os.setsid()
    cmd, env = req["cmd"], req["env"]
    what = cmd[0]
    plan = python_plan(cmd, env, sys.executable, boot_env)
    if plan is None:
      os.execvpe(cmd[0], cmd, env)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    return plan, cmd
  except BaseException as e:  # noqa: BLE001
    os.write(2, ("rlpt-sandbox: cannot run %r: %s\n" % (what, e)).encode())
  os._exit(127)


def reap_all(pid):
  """Waits for `pid` (returns its exit code, negative for a signal), then kills
  and reaps everything else."""
  code = None
  while code is None:
    p, status = os.wait()
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
      return code


def serve(conf):
  """pid 1's loop; returns only in a run's child C, with what C must run."""
  boot_env = dict(os.environ)
  gc.collect()
  gc.freeze()  # children's collections never touch (copy) pid 1's objects
  base = set(mounts())  # the container's own mounts (OCI spec)
  os.write(1, READY)
  while True:
    go_r, go_w = os.pipe()
    ack_r, ack_w = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(go_w)
      os.close(ack_r)
      return child(conf, go_r, ack_w, boot_env)
    os.close(go_r)
    os.close(ack_w)
    nonce = os.urandom(8).hex().encode()
    os.write(2, b"\x00rlpt-run:" + nonce + b"\x00")
    os.write(go_w, b"g")
    os.close(go_w)
    code = reap_all(pid)
    got = os.read(ack_r, 1)
    os.close(ack_r)
    if not got:
      os._exit(0)
    # (a failure in either ends pid 1: the host sees the sandbox die, never reuses it)
    unmount_since(base)
    if got == ACK_RESET:
      reset_workdir(conf)
      base = set(mounts())
    os.write(2, b"\x00rlpt-exit:%s:%d\x00" % (nonce, code))


if __name__ == "__main__":
  _plan, _cmd = serve(json.loads(sys.argv[1]))
  run_python(_plan, _cmd)
