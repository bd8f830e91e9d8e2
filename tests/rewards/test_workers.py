"""The killable worker pool: results in order, per-call timeouts that kill only
the overrunning worker, crashes reported, pipelined calls re-queued."""

import os
import time

import pytest

from rlpt.rewards import workers


def _square(x):
  return x * x


def _sleep_then(x, s):
  time.sleep(s)
  return x


def _crash():
  os._exit(3)


def _raise():
  raise ValueError("boom")


@pytest.fixture(scope="module")
def pool():
  with workers.WorkerPool(2, max_chunk=4) as p:
    yield p


def test_map_in_order(pool):
  out = pool.map([(_square, (i,)) for i in range(50)], timeout_s=5)
  assert [o.status for o in out] == ["ok"] * 50
  assert [o.value for o in out] == [i * i for i in range(50)]


def test_timeout_kills_only_the_slow_call_and_requeues_the_rest(pool):
  kills = pool.kills
  calls = [(_sleep_then, (0, 60))] + [(_sleep_then, (i, 0.01)) for i in range(1, 12)]
  t0 = time.monotonic()
  out = pool.map(calls, timeout_s=[1.0] + [5.0] * 11)
  assert time.monotonic() - t0 < 8
  assert out[0].status == "timeout" and out[0].wall_s >= 1.0
  assert [o.value for o in out[1:]] == list(range(1, 12))
  assert pool.kills == kills + 1
  assert pool.call(_square, (7,), 5).value == 49  # the replacement worker serves


def test_crash_and_exception_are_outcomes(pool):
  out = pool.map([(_crash, ()), (_raise, ()), (_square, (3,))], timeout_s=5)
  assert out[0].status == "error" and "died" in out[0].error
  assert out[1].status == "error" and "ValueError: boom" in out[1].error
  assert out[2].value == 9


def test_bad_arguments():
  with pytest.raises(ValueError, match="max_chunk"):
    workers.WorkerPool(1, max_chunk=0)
  with workers.WorkerPool(1) as p:
    with pytest.raises(ValueError, match="2 timeouts for 1 calls"):
      p.map([(_square, (1,))], [1.0, 2.0])
    out = p.call(lambda: 1, (), 5)  # lambdas do not pickle: reported, not raised
    assert out.status == "error" and "cannot send job" in out.error
