"""The killable worker pool: results in order, per-call timeouts that kill only
the overrunning worker, crashes reported, pipelined calls re-queued."""

import os
import subprocess
import sys
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


def _crash_once(marker):
  if not os.path.exists(marker):
    open(marker, "w").close()
    os._exit(3)
  return "second try"


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


def test_a_death_is_retried_once_on_a_fresh_worker(pool, tmp_path):
  out = pool.map([(_crash_once, (str(tmp_path / "m"),)), (_square, (4,))], timeout_s=5)
  assert out[0].status == "ok" and out[0].value == "second try"
  assert out[1].value == 16
  out = pool.call(_crash, (), 5)  # dies every time: an outcome after the second death
  assert out.status == "error" and "died running this call (2 times, exit code 3)" in out.error


def test_a_pool_that_cannot_start_raises_instead_of_scoring(tmp_path):
  # The forkserver cannot re-import a __main__ read from stdin: every worker dies before
  # its first job. An honest answer must not come back as score 0 / "error".
  script = ("from rlpt.rewards import registry\n"
            "from rlpt.types import Task\n"
            "t = Task('math', 'What is 2+2?', answer='4')\n"
            "try:\n"
            "  print('SCORED', registry.compute_rewards([t], ['The answer is \\\\boxed{4}.']))\n"
            "except registry.VerifierUnavailable as e:\n"
            "  print('UNAVAILABLE', e)\n")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  r = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                     cwd=root, timeout=120, env=dict(os.environ, PYTHONPATH=root))
  assert "SCORED" not in r.stdout, r.stdout
  assert "UNAVAILABLE the verifier worker pool cannot run" in r.stdout, (r.stdout, r.stderr[-2000:])
  assert "die before running any job" in r.stdout


def test_bad_arguments():
  with pytest.raises(ValueError, match="max_chunk"):
    workers.WorkerPool(1, max_chunk=0)
  with workers.WorkerPool(1) as p:
    with pytest.raises(ValueError, match="2 timeouts for 1 calls"):
      p.map([(_square, (1,))], [1.0, 2.0])
    out = p.call(lambda: 1, (), 5)  # lambdas do not pickle: reported, not raised
    assert out.status == "error" and "cannot send job" in out.error
