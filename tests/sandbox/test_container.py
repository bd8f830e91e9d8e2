"""One real gVisor container: what the program sees, and that every path out of
it (finish, kill, crash) leaves nothing on the host."""

from __future__ import annotations

import os
import time

import pytest

import sandbox_helpers
from rlpt.sandbox import bundle, container, default_env
from rlpt.sandbox.result import Limits

pytestmark = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")

PROBE = r'''
import os, sys
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(os.getuid(), os.getgid(), os.getcwd(), st["CapEff"].strip(), st["NoNewPrivs"].strip()
      if "NoNewPrivs" in st else "?")
print(sorted(os.environ.items()))
print(sorted(os.listdir(".")), open("sub/data.txt").read())
print("to stderr", file=sys.stderr)
sys.exit(3)
'''


@pytest.fixture(scope="module")
def state():
  with sandbox_helpers.isolated_pool(0) as (_, state):
    yield state
    assert container.drain(30)


def _cgroups_of(cid):
  return bundle.cgroup_dirs(cid)


def test_program_sees_an_unprivileged_clean_sandbox(state):
  lim = Limits(timeout_s=20, memory_mb=128)
  c = container.Container(lim)
  c.wait_ready(60)
  assert _cgroups_of(c.cid), "runsc created no cgroup for the container"
  env = {**default_env(), "SEED": "7"}
  r = c.execute({"probe.py": PROBE, "sub/data.txt": "payload"}, ["python3", "probe.py"], env, lim)
  assert r.status == "error" and r.exit_code == 3, r
  ids, env_line, files = r.stdout.splitlines()
  uid, gid, cwd, capeff, _ = ids.split()
  assert (uid, gid, cwd, capeff) == ("65534", "65534", "/sandbox", "0000000000000000")
  assert eval(env_line) == sorted(env.items())  # noqa: S307 -- exactly what was passed
  assert files == "['probe.py', 'sub'] payload"
  assert r.stderr == "to stderr\n"
  assert c.reusable and c.alive  # a clean exit: the container may serve again
  container.retire(c)
  assert container.drain(30)
  assert not _cgroups_of(c.cid) and not os.path.exists(c.bundle_dir)


def test_python_env_imports_numpy_and_trimesh(state):
  lim = Limits(timeout_s=120, memory_mb=512)
  c = container.Container(lim)
  c.wait_ready(60)
  r = c.execute({}, ["python3", "-c", "import numpy, trimesh; print(numpy.arange(3).sum(), "
                 "trimesh.creation.box().volume)"], default_env(), lim)
  assert r.status == "ok", r
  assert r.stdout.split() == ["3", "1.0"], r
  container.retire(c)


def test_kill_of_an_idle_container_leaves_nothing(state):
  c = container.Container(Limits(memory_mb=64))
  c.wait_ready(60)
  c.kill()
  c.kill()  # idempotent
  assert not c.alive and not _cgroups_of(c.cid) and not os.path.exists(c.bundle_dir)
  assert not [x for x in sandbox_helpers.leftovers(state) if c.cid in x]


def test_sandbox_crash_is_a_retryable_infra_error(state):
  lim = Limits(timeout_s=20, memory_mb=64)
  c = container.Container(lim)
  try:
    c.wait_ready(60)
    sandbox_helpers.crash_sandbox(c.cid)
    r = c.execute({}, ["true"], default_env(), lim)
  finally:
    c.kill()
  assert r.status == "infra_error" and r.retryable, r
  assert "ended without reporting" in r.reason
  assert not _cgroups_of(c.cid) and not os.path.exists(c.bundle_dir)


def test_a_background_boot_runs_at_a_low_cpu_weight_until_ready(state):
  c = container.Container(Limits(memory_mb=64), background=True)
  try:
    def shares():
      cpu = [d for d in _cgroups_of(c.cid) if "/cpu/" in d]
      try:
        return int(open(os.path.join(cpu[0], "cpu.shares")).read()) if cpu else None
      except (OSError, ValueError):  # runsc is still setting the cgroup up
        return None
    deadline = time.monotonic() + 30
    while shares() != bundle.BOOT_CPU_SHARES and time.monotonic() < deadline:
      time.sleep(0.01)
    assert shares() == bundle.BOOT_CPU_SHARES  # nothing raises it before wait_ready
    c.wait_ready(60)
    assert shares() == bundle.DEFAULT_CPU_SHARES
    assert c.execute({}, ["true"], default_env(), Limits(memory_mb=64)).ok
  finally:
    c.kill()
