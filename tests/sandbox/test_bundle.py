"""The OCI spec every sandbox boots from, and the missing-runsc error."""

import os
import sys

import pytest

from rlpt import sandbox
from rlpt.sandbox import bundle
from rlpt.sandbox.result import Limits


@pytest.fixture
def spec(tmp_path, monkeypatch):
  monkeypatch.setenv("RLPT_SANDBOX_DIR", str(tmp_path))
  return bundle.oci_spec(["/bin/true"], Limits(memory_mb=200, max_pids=10, disk_mb=8, cpus=0.5))


def test_process_is_locked_down(spec):
  p = spec["process"]
  assert p["noNewPrivileges"] is True and p["cwd"] == "/sandbox"
  # pid 1 boots with the sandbox's default environment, nothing of the host's.
  assert sorted(p["env"]) == sorted(f"{k}={v}" for k, v in sandbox.default_env().items())
  assert {e.split("=")[0] for e in p["env"]} == {"PATH", "HOME", "LANG"}
  caps = p["capabilities"]
  assert caps["inheritable"] == caps["ambient"] == []
  assert set(caps["effective"]) == set(caps["permitted"]) == set(caps["bounding"]) == {
      "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN"}
  rl = {r["type"]: (r["soft"], r["hard"]) for r in p["rlimits"]}
  assert rl["RLIMIT_CORE"] == (0, 0)
  assert rl["RLIMIT_FSIZE"] == (8 << 20, 8 << 20)
  assert rl["RLIMIT_NPROC"] == (10, 10)
  assert rl["RLIMIT_NOFILE"][1] <= 1024 and rl["RLIMIT_CPU"][1] <= bundle.MAX_CPU_SECONDS


def test_cgroup_limits(spec):
  r = spec["linux"]["resources"]
  assert r["memory"]["limit"] == (200 + bundle.SENTRY_OVERHEAD_MB) << 20
  assert r["cpu"] == {"period": 100_000, "quota": 50_000, "shares": bundle.DEFAULT_CPU_SHARES}
  assert r["pids"]["limit"] >= 10
  assert {n["type"] for n in spec["linux"]["namespaces"]} >= {"pid", "network", "ipc", "mount"}


def test_a_background_boot_gets_a_low_cpu_weight(tmp_path, monkeypatch):
  monkeypatch.setenv("RLPT_SANDBOX_DIR", str(tmp_path))
  spec = bundle.oci_spec(["/bin/true"], Limits(), cpu_shares=bundle.BOOT_CPU_SHARES)
  assert spec["linux"]["resources"]["cpu"]["shares"] == bundle.BOOT_CPU_SHARES
  assert bundle.BOOT_CPU_SHARES * 4 <= bundle.DEFAULT_CPU_SHARES
  assert bundle.set_cpu_shares("rlpt-no-such-container", 1024) is False


def test_mounts_are_read_only_except_the_tmpfs(spec):
  assert spec["root"]["readonly"] is True
  by_dest = {m["destination"]: m for m in spec["mounts"]}
  for dest in ["/usr", sys.prefix] + [p for p in bundle.python_mounts()]:
    assert "ro" in by_dest[bundle.sandbox_path(dest)]["options"], dest
  for dest in ("/sandbox", "/tmp"):
    assert by_dest[dest]["type"] == "tmpfs" and "size=8m" in by_dest[dest]["options"]
  writable = [m["destination"] for m in spec["mounts"]
              if m["type"] == "bind" and "ro" not in m["options"]]
  assert writable == []
  # Nothing of the checkout, /etc or /root beyond the Python environment.
  assert "/etc" not in by_dest and "/root" not in by_dest and "/work" not in by_dest
  assert not any(d == os.getcwd() for d in by_dest)


def test_rootfs_holds_only_mount_points_and_a_minimal_etc(spec):
  root = spec["root"]["path"]
  assert sorted(os.listdir(os.path.join(root, "etc"))) == ["group", "hosts", "passwd"]
  assert os.listdir(os.path.join(root, "sandbox")) == []


def test_missing_runsc_says_how_to_install(monkeypatch):
  bundle.runsc_path.cache_clear()
  monkeypatch.setenv("RLPT_RUNSC", "/nonexistent/runsc")
  try:
    with pytest.raises(sandbox.RunscNotFound, match=r"make test.*make run.*apt-get install -y runsc"):
      bundle.runsc_path()
    with pytest.raises(sandbox.RunscNotFound):
      sandbox.SandboxPool(1)
  finally:
    monkeypatch.delenv("RLPT_RUNSC")
    bundle.runsc_path.cache_clear()


def test_python_env_under_a_shadowed_path_is_mounted_elsewhere():
  """A checkout under /tmp (hidden inside by the sandbox's own /tmp tmpfs) keeps its
  venv importable: it is mounted under ENV_ROOT at the same relative path."""
  from rlpt.sandbox import bundle as b
  assert b.sandbox_path("/tmp/ci/clone/.venv") == b.ENV_ROOT + "/tmp/ci/clone/.venv"
  assert b.sandbox_path("/sandbox/x") == b.ENV_ROOT + "/sandbox/x"
  assert b.sandbox_path("/work/main/.venv") == "/work/main/.venv"
  assert b.sandbox_path("/tmpfoo/.venv") == "/tmpfoo/.venv"
  assert b.sandbox_path_env().split(":")[0] == b.sandbox_path(__import__("sys").prefix) + "/bin"
