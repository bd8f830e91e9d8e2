"""SandboxSession in real runsc sandboxes: /sandbox persists across one episode's
runs and nothing else does; closing resets it; the container then serves clean."""

from __future__ import annotations

import gc
import os
import signal
import threading

import pytest

import sandbox_helpers
from rlpt.sandbox import SessionLost

pytestmark = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")

PROBE = r'''
import os
me = os.getpid()
procs = sorted(open(f"/proc/{p}/cmdline").read().replace("\0", " ").strip()
               for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me))
print((sorted(os.listdir(".")), sorted(os.listdir("/tmp")), procs))
'''


def _probe(run) -> tuple[list, list, list]:
  r = run({"probe.py": PROBE}, ["python3", "probe.py"])
  assert r.status == "ok", r
  return eval(r.stdout)  # noqa: S307 -- our own program's repr of three lists


def test_files_persist_across_runs_and_nothing_else_does():
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    with pool.session(timeout_s=20) as s:
      r = s.run({"a.txt": "one"}, ["sh", "-c", "echo two > b.txt; mkdir -p d; echo 3 > d/c; "
                                               "touch /tmp/t; setsid sleep 1000 & echo started"])
      assert r.status == "ok" and "started" in r.stdout, r
      r = s.run({}, ["sh", "-c", "cat a.txt; echo; cat b.txt d/c"])
      assert r.status == "ok" and r.stdout.split() == ["one", "two", "3"], r
      files, tmp, procs = _probe(s.run)
      assert files == ["a.txt", "b.txt", "d", "probe.py"] and tmp == [] and procs == [], (
          files, tmp, procs)
      r = s.run({"a.txt": "replaced"}, ["sh", "-c", "rm b.txt; cat a.txt"])
      assert r.stdout == "replaced", r
      assert _probe(s.run)[0] == ["a.txt", "d", "probe.py"]
      assert s.stats.runs == 5 and s.stats.lost == 0


def test_close_resets_the_workdir_and_the_container_serves_clean_again():
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    pool.reuse = 16
    pool.warm(wait=True)
    boots = pool.stats.boots
    s = pool.session()
    s.run({"secret.txt": "episode 1"}, ["python3", "-c", ""])
    c = s._c
    s.close()
    s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
      s.run({}, ["true"])
    # a one-shot run in the same container sees only its own file
    r = pool.run({"x.py": "import os; print(sorted(os.listdir('.')))"}, ["python3", "x.py"])
    assert r.stdout.strip() == "['x.py']", r
    with pool.session() as s2:
      files, tmp, procs = _probe(s2.run)
      assert s2._c is c, "the second session did not reuse the container"
      assert files == ["probe.py"] and tmp == [] and procs == []
      # ... and what a one-shot run wrote did not reach the session's workdir
    assert pool.stats.boots == boots


def test_one_shot_runs_do_not_accumulate_memory_in_a_reused_container():
  """Each run writes 48 MiB into its workdir under a 128 MiB memory limit: the
  run's tmpfs must be gone with the run (gVisor used to keep every run's tmpfs
  mounted in pid 1's namespace, so the third run hit the OOM killer)."""
  fill = "open('big', 'wb').write(b'x' * (48 << 20)); print('ok')"
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    pool.reuse = 8
    statuses = [pool.run({}, ["python3", "-c", fill], memory_mb=128, disk_mb=64,
                         timeout_s=30).status for _ in range(5)]
    assert statuses == ["ok"] * 5
    assert pool.stats.boots + pool.stats.cold_boots <= 2  # one container served them


def test_a_run_that_kills_the_sandbox_loses_the_files_and_says_so():
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    with pool.session(timeout_s=20) as s:
      s.run({"keep.txt": "x"}, ["python3", "-c", ""])
      r = s.run({}, ["sleep", "60"], timeout_s=1.0)
      assert r.status == "timeout" and "next run starts in an empty /sandbox" in r.reason, r
      assert s.stats.lost == 1
      files, _, procs = _probe(s.run)
      assert files == ["probe.py"] and procs == []


def test_an_unclosed_session_never_serves_again():
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    pool.reuse = 16
    s = pool.session()
    s.run({"left.txt": "x"}, ["python3", "-c", ""])
    c = s._c
    del s
    gc.collect()
    r = pool.run({"x.py": "import os; print(sorted(os.listdir('.')))"}, ["python3", "x.py"])
    assert r.stdout.strip() == "['x.py']", r
    assert not c.alive or c not in pool._ready[c.limits.spec_key]


def test_infrastructure_failure_raises_instead_of_scoring():
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    with pool.session(timeout_s=20) as s:
      s.run({}, ["python3", "-c", ""])
      pid = s._c.proc.pid
      threading.Timer(1.0, os.killpg, (pid, signal.SIGKILL)).start()  # runsc dies mid-run
      with pytest.raises(SessionLost, match="sandbox failed"):
        s.run({}, ["sleep", "10"])
      assert s.stats.lost == 0  # not the program's doing
      s.run({}, ["python3", "-c", ""])  # a new sandbox serves the session on
      os.killpg(s._c.proc.pid, signal.SIGKILL)  # ... and dies between runs
      s._c.proc.wait(timeout=10)
      with pytest.raises(SessionLost, match="died between runs"):
        s.run({}, ["python3", "-c", "print(1)"])
