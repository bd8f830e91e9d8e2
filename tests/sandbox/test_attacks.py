"""The attack suite: hostile programs in real runsc sandboxes.

Every attack runs once, concurrently with the others, from one warm pool (module
fixture); each test then checks the verdict and the host: no host process killed,
no host file read or written, no connection reached the host, nothing of the
sandbox left behind, and the next run from the same pool starts clean.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import threading
import uuid

import pytest

import sandbox_helpers

pytestmark = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRET = f"rlpt-secret-{uuid.uuid4().hex}"
SMALL = dict(memory_mb=128, timeout_s=3.0, max_pids=32, disk_mb=16, max_output_bytes=64_000)


class _Listener:
  """A TCP server on host loopback that records every connection it accepts."""

  def __init__(self):
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(16)
    self.sock.settimeout(0.2)
    self.port = self.sock.getsockname()[1]
    self.accepted = []
    self._stop = threading.Event()
    self._t = threading.Thread(target=self._loop, daemon=True)
    self._t.start()

  def _loop(self):
    while not self._stop.is_set():
      try:
        conn, addr = self.sock.accept()
      except OSError:
        continue
      self.accepted.append(addr)
      conn.close()

  def close(self):
    self._stop.set()
    self._t.join()
    self.sock.close()


def _attacks(port: int, victim_pid: int, secret_paths: dict[str, str]) -> dict[str, dict]:
  py = lambda src, **kw: dict(files={"a.py": src}, cmd=["python3", "a.py"], **{**SMALL, **kw})
  return {
      "fork_bomb": py("import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n"
                      "    pass\n"),
      # The plain shape (no except): each copy dies of EAGAIN once the guest's
      # RLIMIT_NPROC trips. Under a host pids cgroup sized too tight for ptrace's host
      # tasks this killed the sentry itself, and the run came back as infra_error.
      "fork_bomb_uncaught": py("import os\nwhile True:\n  os.fork()\n", max_pids=32),
      "memory_bomb": py("x = []\nwhile True:\n  x.append(bytearray(32 << 20))\n",
                        timeout_s=60.0),  # ends at the cgroup limit, long before that
      "disk_fill_workdir": py(
          "import os\nn = 0\ntry:\n  while True:\n    with open(f'f{n}', 'wb') as f:\n"
          "      f.write(b'x' * (1 << 20))\n    n += 1\nexcept OSError as e:\n"
          "  print('stopped', n, e.errno)\n", memory_mb=256),
      "disk_fill_tmp": py(
          "import os\nn = 0\ntry:\n  while True:\n    with open(f'/tmp/f{n}', 'wb') as f:\n"
          "      f.write(b'x' * (1 << 20))\n    n += 1\nexcept OSError as e:\n"
          "  print('stopped', n, e.errno)\n", memory_mb=256),
      "stdout_flood": py("import sys\nwhile True:\n  sys.stdout.write('A' * 65536)\n"),
      "infinite_loop": py("while True:\n  pass\n", timeout_s=2.0),
      "sleep_past_deadline": dict(files={}, cmd=["sleep", "60"], **{**SMALL, "timeout_s": 1.5}),
      "cpu_spin_threads": py(
          "import threading\ndef spin():\n  while True:\n    pass\n"
          "for _ in range(16):\n  threading.Thread(target=spin).start()\n", timeout_s=2.0),
      "tcp_to_host": py(
          "import socket\nfor host in ('127.0.0.1', '10.0.2.2', '172.17.0.1'):\n  try:\n"
          f"    socket.create_connection((host, {port}), timeout=1).close()\n"
          "    print('CONNECTED', host)\n  except OSError as e:\n    print('blocked', host, e)\n"),
      "dns_lookup": py(
          "import socket\ntry:\n  print('RESOLVED', socket.getaddrinfo('pypi.org', 443))\n"
          "except OSError as e:\n  print('blocked', e)\n"),
      "read_host_files": py(
          "import os\nfor p in " + repr(sorted(secret_paths.values()) + ["/etc/shadow"]) + ":\n"
          "  try:\n    print('READ', p, open(p).read())\n  except OSError as e:\n"
          "    print('blocked', p, e.errno)\n"
          "print('root', sorted(os.listdir('/root')) if os.path.isdir('/root') else None)\n"
          f"print('checkout', sorted(os.listdir({str(ROOT)!r})) "
          f"if os.path.isdir({str(ROOT)!r}) else None)\n"),
      "write_read_only": py(
          "import os, sys\nfor p in ['/usr/rlpt-pwn', '/rlpt-pwn', '/etc/rlpt-pwn', "
          f"{sys.prefix + '/rlpt-pwn'!r}, {os.path.realpath(sys.executable) + '-pwn'!r}]:\n"
          "  try:\n    open(p, 'w').write('x')\n    print('WROTE', p)\n  except OSError as e:\n"
          "    print('blocked', p, e.errno)\n"),
      "symlink_escape": py(
          "import os\n"
          f"os.symlink({secret_paths['tmp']!r}, 'link')\n"
          "try:\n  print('READ', open('link').read())\nexcept OSError as e:\n"
          "  print('blocked read', e.errno)\n"
          "try:\n  open('link', 'w').write('pwned')\n  print('WROTE')\nexcept OSError as e:\n"
          "  print('blocked write', e.errno)\n"),
      "kill_everything": py(
          "import os, signal\n"
          "try:\n  os.kill(-1, signal.SIGKILL)\nexcept OSError as e:\n  print('kill -1:', e)\n"
          f"for pid in ({victim_pid}, 1, {os.getpid()}):\n"
          "  try:\n    os.kill(pid, signal.SIGKILL)\n    print('signalled', pid)\n"
          "  except OSError as e:\n    print('blocked', pid, e.errno)\n"
          "import os\nprint('survived', os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"),
      "leave_processes_behind": dict(
          files={"a.sh": "setsid sleep 1000 &\nnohup sleep 1000 >/dev/null 2>&1 &\n"
                         "touch /tmp/marker /sandbox/marker\nwhile :; do :; done\n"},
          cmd=["sh", "a.sh"], **{**SMALL, "timeout_s": 1.5}),
      "daemon_after_exit": dict(
          files={"a.sh": "setsid sh -c 'sleep 1000' &\necho spawned\n"},
          cmd=["sh", "a.sh"], **SMALL),
  }


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
  listener = _Listener()
  victim = subprocess.Popen(["sleep", "600"])
  tmp_secret = tmp_path_factory.mktemp("secret") / "secret.txt"
  tmp_secret.write_text(SECRET)
  home_secret = pathlib.Path("/root") / f".rlpt-sandbox-bait-{uuid.uuid4().hex[:8]}"
  secrets = {"tmp": str(tmp_secret), "checkout": str(ROOT / "pyproject.toml")}
  try:
    home_secret.write_text(SECRET)
    secrets["home"] = str(home_secret)
  except OSError:
    pass
  host_before = _host_snapshot()
  try:
    with sandbox_helpers.isolated_pool(4) as (pool, state):
      pool.warm(wait=True)
      attacks = _attacks(listener.port, victim.pid, secrets)
      names = list(attacks)
      results = dict(zip(names, pool.run_batch([attacks[n] for n in names], max_concurrency=4)))
      # The next run from the same pool must start on a clean state.
      results["next_run"] = pool.run(
          {"check.py": "import os\nprint(sorted(os.listdir('.')), sorted(os.listdir('/tmp')))\n"
                       "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"},
          ["python3", "check.py"], timeout_s=20)
      session = _across_one_session(pool, attacks)
      during = sandbox_helpers.leftovers(state)
    yield dict(results=results, listener=listener, victim=victim, secrets=secrets,
               host_before=host_before, during=during, state=state, session=session)
  finally:
    listener.close()
    victim.kill()
    victim.wait()
    if home_secret.exists():
      home_secret.unlink()


PROBE = ("import os\nme = os.getpid()\n"
         "procs = [open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ').strip()\n"
         "         for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, me)]\n"
         "print(repr((sorted(os.listdir('.')), sorted(os.listdir('/tmp')), procs)))\n")


def _across_one_session(pool, attacks: dict[str, dict]) -> dict:
  """Every attack as one turn of a single episode (SandboxSession), each followed
  by a probe turn; then what the next session from the pool sees."""
  names = sorted(attacks, key=lambda n: n == "disk_fill_workdir")  # the full disk last
  results, probes = {}, {}
  limits = {k: v for k, v in SMALL.items() if k != "timeout_s"}
  with pool.session(**limits) as s:
    for name in names:
      a = attacks[name]
      results[name] = s.run(a["files"], a["cmd"], timeout_s=a.get("timeout_s", 3.0))
      probe = s.run({}, ["python3", "-c", PROBE], timeout_s=20)
      probes[name] = eval(probe.stdout) if probe.ok else probe  # noqa: S307 -- our repr
    lost = s.stats.lost
  with pool.session(**limits) as s:
    after = eval(s.run({}, ["python3", "-c", PROBE], timeout_s=20).stdout)  # noqa: S307
  return dict(results=results, probes=probes, lost=lost, after=after)


# What each attack may come back as (the one-shot tests below say why).
EXPECTED = {"fork_bomb": {"timeout", "oom"}, "fork_bomb_uncaught": {"error", "timeout", "oom"},
            "memory_bomb": {"oom"}, "disk_fill_workdir": {"ok"}, "disk_fill_tmp": {"ok"},
            "stdout_flood": {"output_limit"}, "infinite_loop": {"timeout"},
            "sleep_past_deadline": {"timeout"}, "cpu_spin_threads": {"timeout"},
            "tcp_to_host": {"ok"}, "dns_lookup": {"ok"}, "read_host_files": {"ok"},
            "write_read_only": {"ok"}, "symlink_escape": {"ok"}, "kill_everything": {"ok", "error"},
            "leave_processes_behind": {"timeout"}, "daemon_after_exit": {"ok"}}


def test_the_suite_across_the_turns_of_one_session(suite):
  """Sessions under attack: every attack as a turn of one episode. Each ends as it
  does one-shot, no process outlives its turn, /tmp is fresh every turn, nothing
  reaches the host, and the next episode starts on an empty /sandbox."""
  ses = suite["session"]
  assert set(ses["results"]) == set(EXPECTED)
  for name, r in ses["results"].items():
    assert r.status in EXPECTED[name], (name, r)
    out = r.stdout + r.stderr
    for bad in (SECRET, "CONNECTED", "RESOLVED", "WROTE", "READ "):
      assert bad not in out, (name, out)
    files, tmp, procs = ses["probes"][name]
    assert procs == [] and tmp == [], (name, procs, tmp)
  assert "blocked 1 1" in ses["results"]["kill_everything"].stdout
  # the container died on each timeout / oom / flood (the program's doing), and
  # the episode went on in a fresh one; files of the turns before persisted otherwise
  assert ses["lost"] == sum(r.status in ("timeout", "oom", "output_limit")
                            for r in ses["results"].values())
  assert "link" in ses["probes"]["symlink_escape"][0]
  assert ses["after"] == ([], [], []), ses["after"]
  assert suite["victim"].poll() is None and suite["listener"].accepted == []
  assert _host_snapshot() == suite["host_before"]


def _host_snapshot() -> dict:
  return {"shadow": pathlib.Path("/etc/shadow").read_bytes() if os.path.exists("/etc/shadow")
          else b"", "pyproject": (ROOT / "pyproject.toml").read_bytes()}


def _out(suite, name):
  r = suite["results"][name]
  return r, r.stdout + r.stderr


def test_fork_bomb_is_contained(suite):
  r, _ = _out(suite, "fork_bomb")
  # RLIMIT_NPROC stops the forks; the survivors spin (timeout) or their copies
  # fill the memory cgroup first (oom): either way contained and not retryable.
  assert r.status in ("timeout", "oom"), r
  assert not r.retryable
  assert suite["victim"].poll() is None


def test_uncaught_fork_bomb_is_the_programs_fault(suite):
  r, _ = _out(suite, "fork_bomb_uncaught")
  assert r.status in ("error", "timeout", "oom"), r  # never infra_error: not retryable
  assert not r.retryable


def test_memory_bomb_is_oom(suite):
  r, _ = _out(suite, "memory_bomb")
  assert r.status == "oom", r
  assert "memory_mb=128" in r.reason and not r.retryable


@pytest.mark.parametrize("name", ["disk_fill_workdir", "disk_fill_tmp"])
def test_disk_fill_stops_at_the_tmpfs_size(suite, name):
  r, out = _out(suite, name)
  assert r.status == "ok", r
  words = r.stdout.split()
  assert words[0] == "stopped", r
  written_mb = int(words[1])
  assert 8 <= written_mb <= SMALL["disk_mb"], r  # 16 MiB tmpfs: ENOSPC near 16 files
  assert int(words[2]) == 28, r  # ENOSPC


def test_stdout_flood_is_capped(suite):
  r, _ = _out(suite, "stdout_flood")
  assert r.status == "output_limit", r
  assert len(r.stdout) == SMALL["max_output_bytes"] and set(r.stdout) == {"A"}
  assert r.exit_code is None and not r.retryable


@pytest.mark.parametrize("name,timeout", [("infinite_loop", 2.0), ("sleep_past_deadline", 1.5),
                                          ("cpu_spin_threads", 2.0),
                                          ("leave_processes_behind", 1.5)])
def test_runaway_programs_time_out(suite, name, timeout):
  r, _ = _out(suite, name)
  assert r.status == "timeout", r
  assert timeout <= r.wall_s < timeout + 10, r
  assert f"timeout_s={timeout:g}" in r.reason


def test_no_network_to_host_or_dns(suite):
  r, out = _out(suite, "tcp_to_host")
  assert r.status == "ok", r
  assert "CONNECTED" not in out and out.count("blocked") == 3, out
  assert suite["listener"].accepted == []
  r, out = _out(suite, "dns_lookup")
  assert r.status == "ok" and "RESOLVED" not in out and "blocked" in out, r


def test_host_files_are_unreadable(suite):
  r, out = _out(suite, "read_host_files")
  assert r.status == "ok", r
  assert SECRET not in out and "READ" not in out, out
  assert "root:" not in out  # no /etc/shadow line
  root_line = next(line for line in out.splitlines() if line.startswith("root "))
  assert not any(".rlpt-sandbox-bait" in x for x in root_line.split()), root_line
  checkout_line = next(line for line in out.splitlines() if line.startswith("checkout "))
  assert "pyproject.toml" not in checkout_line and "rlpt" not in checkout_line.split("[")[-1], \
      checkout_line


def test_read_only_mounts_stay_unwritten(suite):
  r, out = _out(suite, "write_read_only")
  assert r.status == "ok", r
  assert "WROTE" not in out and out.count("blocked") == 5, out
  for p in ["/usr/rlpt-pwn", "/rlpt-pwn", "/etc/rlpt-pwn", sys.prefix + "/rlpt-pwn",
            os.path.realpath(sys.executable) + "-pwn"]:
    assert not os.path.exists(p), p
  assert _host_snapshot() == suite["host_before"]


def test_symlink_to_host_path_reaches_nothing(suite):
  r, out = _out(suite, "symlink_escape")
  assert r.status == "ok", r
  assert SECRET not in out and "READ" not in out and "WROTE" not in out, out
  # Host-side: the target the link named is intact, nothing was created next to it.
  tmp = pathlib.Path(suite["secrets"]["tmp"])
  assert tmp.read_text() == SECRET and sorted(p.name for p in tmp.parent.iterdir()) == [
      "secret.txt"]


def test_signals_do_not_reach_the_host(suite):
  r, out = _out(suite, "kill_everything")
  assert r.status in ("ok", "error"), r  # the program may kill itself; never the host
  assert "blocked 1 1" in out, out  # EPERM: pid 1 (the launcher) is out of its reach
  assert suite["victim"].poll() is None, "a host process was killed from the sandbox"
  os.kill(os.getpid(), 0)


def test_daemons_and_leftovers_are_gone(suite):
  r, out = _out(suite, "daemon_after_exit")
  assert r.status == "ok" and "spawned" in out, r
  # The pool is closed: no runsc process, container or bundle of it may remain
  # (gVisor's processes live inside the sandbox process, so this covers them).
  assert sandbox_helpers.leftovers(suite["state"]) == []
  assert suite["during"] == [] or all("rlpt-" in x for x in suite["during"])


def test_next_run_from_the_pool_starts_clean(suite):
  r = suite["results"]["next_run"]
  assert r.status == "ok", r
  lines = r.stdout.splitlines()
  assert lines[0] == "['check.py'] []", lines  # no marker, no files of earlier runs
  pids = eval(lines[1])  # noqa: S307 -- our own program's repr of a list of str
  assert len(pids) <= 2, pids  # the launcher and this program only


POLLUTER = r'''
import ctypes, os, socket, subprocess
open("left.txt", "w").write("x")
open("/tmp/left.txt", "w").write("x")
if os.path.isdir("/dev/shm"):
  open("/dev/shm/left", "w").write("x")
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(0x5eed, 4096, 0o1666))  # IPC_CREAT | 0666
s = socket.socket(socket.AF_UNIX)
s.bind("\0rlpt-left")
s.listen()
subprocess.Popen(["sleep", "1000"], start_new_session=True)
os.fork() or os.execvp("sleep", ["sleep", "999"])
print("polluted")
'''

CHECKER = r'''
import ctypes, os, socket
print(sorted(os.listdir(".")), sorted(os.listdir("/tmp")),
      sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else [])
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(0x5eed, 4096, 0o666))
try:
  socket.socket(socket.AF_UNIX).connect("\0rlpt-left")
  print("socket CONNECTED")
except OSError:
  print("socket gone")
me = os.getpid()
others = [open(f"/proc/{p}/cmdline").read().replace("\0", " ") for p in os.listdir("/proc")
          if p.isdigit() and int(p) not in (1, me)]
print("procs", others)
'''


def test_a_reused_sandbox_starts_clean_after_a_polluter():
  """A run that exits cleanly leaves files in every writable place, a SysV shm
  segment, an abstract socket and daemons; the next run in the SAME container
  must see none of it."""
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    pool.reuse = 4
    pool.warm(wait=True)
    r = pool.run({"p.py": POLLUTER}, ["python3", "p.py"], timeout_s=20)
    assert r.status == "ok" and "polluted" in r.stdout and "shm -1" not in r.stdout, r
    boots = pool.stats.boots
    with pool._cv:
      (c,) = pool._ready[next(iter(pool._ready))]
    assert c.runs == 1
    r = pool.run({"c.py": CHECKER}, ["python3", "c.py"], timeout_s=20)
    assert c.runs == 2 and pool.stats.boots == boots, "the checker did not reuse the container"
    assert r.status == "ok", r
    files, shm, sock, procs = r.stdout.splitlines()
    assert files == "['c.py'] [] []", files
    assert shm == "shm -1" and sock == "socket gone" and procs == "procs []", r.stdout
