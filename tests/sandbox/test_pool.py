"""The warm pool and the public run / run_async / run_batch API, on real runsc."""

from __future__ import annotations

import asyncio
import time

import pytest

import sandbox_helpers
from rlpt import sandbox
from rlpt.sandbox import bundle, container
from rlpt.sandbox.result import Limits

pytestmark = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")


@pytest.fixture(scope="module")
def pool():
  with sandbox_helpers.isolated_pool(2) as (p, _):
    p.warm(wait=True)
    yield p


def test_warm_pool_serves_and_refills(pool):
  assert pool.ready_count() == 2
  hits = pool.stats.warm_hits
  r = pool.run({"t.py": "print(6 * 7)"}, ["python3", "t.py"])
  assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "42\n"), r
  assert pool.stats.warm_hits == hits + 1
  deadline = time.monotonic() + 60
  while pool.ready_count() < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
  assert pool.ready_count() == 2


def test_infra_error_is_retried_on_a_new_sandbox(pool):
  pool.warm(wait=True)
  with pool._cv:
    victims = list(pool._ready[Limits().spec_key])
  for c in victims:  # crash every warm sandbox behind runsc's back
    sandbox_helpers.crash_sandbox(c.cid)
  time.sleep(0.5)
  r = pool.run({}, ["python3", "-c", "print('again')"], retries=2)
  assert (r.status, r.stdout) == ("ok", "again\n"), r
  r = pool.run({}, ["sh", "-c", "exit 5"], retries=0)
  assert (r.status, r.exit_code) == ("error", 5), r


def test_env_is_only_what_is_passed(pool):
  r = pool.run({}, ["python3", "-c", "import os; print(sorted(os.environ))"], env={"K": "v"})
  assert r.stdout.strip() == str(sorted({**sandbox.default_env(), "K": "v"})), r


def test_batch_keeps_order_and_async_runs(pool):
  reqs = [{"files": {"n.txt": str(i)}, "cmd": ["cat", "n.txt"], "timeout_s": 20}
          for i in range(6)]
  rs = pool.run_batch(reqs, max_concurrency=3)
  assert [r.stdout for r in rs] == [str(i) for i in range(6)]

  async def two():
    return await asyncio.gather(pool.run_async({}, ["echo", "a"]),
                                pool.run_async({}, ["echo", "b"]))
  assert [r.stdout for r in asyncio.run(two())] == ["a\n", "b\n"]
  with pytest.raises(ValueError, match="request 0 needs 'files' and 'cmd'"):
    pool.run_batch([{"cmd": ["true"]}])


def test_bad_requests_fail_before_any_sandbox(pool):
  with pytest.raises(ValueError, match="sandbox file name '../x'"):
    pool.run({"../x": ""}, ["true"])
  with pytest.raises(ValueError, match="sandbox limit memory_mb"):
    pool.run({}, ["true"], memory_mb=0)
  with pytest.raises(NotImplementedError, match=r"network=True\) is not supported"):
    pool.run({}, ["true"], network=True)


def test_module_level_api_uses_the_default_pool(pool):
  try:
    r = sandbox.run({"a.py": "import sys; print(sys.argv[1:])"}, ["python3", "a.py", "x"],
                    timeout_s=30, memory_mb=256)
    assert (r.status, r.stdout) == ("ok", "['x']\n"), r
    r = asyncio.run(sandbox.run_async({}, ["sh", "-c", "echo $HOME"]))
    assert r.stdout == "/sandbox\n"
    assert [r.status for r in sandbox.run_batch([{"files": {}, "cmd": ["false"]}])] == ["error"]
  finally:
    sandbox.default_pool().close()


@pytest.mark.parametrize("cmd,status", [(["sh", "-c", "while :; do :; done"], "timeout"),
                                        (["sh", "-c", "yes"], "output_limit")])
def test_a_misbehaving_sandbox_is_destroyed_not_reused(pool, cmd, status):
  pool.warm(wait=True)
  key = Limits().spec_key
  with pool._cv:
    used = pool._ready[key][0]  # the next run takes the leftmost
  runs_before = used.runs
  r = pool.run({}, cmd, timeout_s=1.5, max_output_bytes=10_000)
  assert r.status == status, r
  assert not used.alive and not bundle.cgroup_dirs(used.cid)
  with pool._cv:
    assert used not in pool._ready[key]
  ok = pool.run({}, ["true"])
  assert ok.status == "ok" and used.runs == runs_before + 1  # it never served again


def test_a_clean_sandbox_is_reused_up_to_the_limit():
  with sandbox_helpers.isolated_pool(1) as (p, _):
    p.reuse = 3
    p.warm(wait=True)
    with p._cv:
      first = p._ready[Limits().spec_key][0]
    for _ in range(4):
      assert p.run({}, ["sh", "-c", "exit 1"]).status == "error"  # error is still clean
    assert container.drain(30)
    assert first.runs == 3 and not first.alive  # retired after its 3rd run
    assert p.stats.boots == 2


def test_a_replacement_boots_before_a_container_reaches_its_reuse_limit():
  with sandbox_helpers.isolated_pool(1) as (p, _):
    p.reuse = 16
    assert p.prefetch == 4
    p.warm(wait=True)
    with p._cv:
      first = p._ready[Limits().spec_key][0]
    for i in range(12):
      assert p.run({}, ["python3", "-c", f"print({i})"]).stdout == f"{i}\n"
    assert first.runs == 12 and p.stats.boots == 1
    deadline = time.monotonic() + 60  # its replacement boots while it still serves
    while p.ready_count() < 2 and time.monotonic() < deadline:
      time.sleep(0.05)
    assert p.ready_count() == 2 and p.stats.boots == 2
    for _ in range(5):
      assert p.run({}, ["true"]).ok
    assert container.drain(30)
    assert first.runs == 16 and not first.alive  # retired at its limit; nobody waited
    assert (p.stats.boots, p.stats.cold_boots, p.stats.warm_hits) == (2, 0, 17)
