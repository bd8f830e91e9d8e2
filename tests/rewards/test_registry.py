"""The registry: every domain yields tasks and scores its own reference answers 1;
penalties, the batch API's ordering and per-sample timeouts, bad input."""

import threading
import time

import pytest

from rlpt import rewards
from rlpt.data import sources
from rlpt.rewards import registry
from rlpt.types import RewardResult, Task

# Generators whose entries carry no reference solution, so there is nothing to
# score 1 with.
# (rush_hour's entries hold no move list either; its reference is found by BFS.)
NO_REFERENCE = {"rg/boxnet": "no reference plan in the entry (its checker simulates any plan)"}


def test_registry_names():
  doms = set(rewards.VERIFIER_REGISTRY)
  from reasoning_gym.factory import DATASETS
  assert len(DATASETS) >= 100
  assert {f"rg/{n}" for n in DATASETS} <= doms
  builtin = {"math", "code", "extraction", "geometry", "python_tool", "code_repair"}
  assert builtin <= doms
  assert set(sources.domains()) == builtin | {f"rg/{n}" for n in DATASETS}
  assert len(doms) >= 110


def test_every_domain_scores_its_reference_one():
  tasks, comps = [], []
  for domain in sorted(rewards.VERIFIER_REGISTRY):
    if domain in NO_REFERENCE or domain not in sources.domains():
      continue
    src = sources.get_source(domain, seed=0)
    for i in range(2):
      t = src.train(i)
      assert t.domain == domain and t.prompt
      tasks.append(t)
      comps.append(src.reference(t))
  results = rewards.compute_rewards(tasks, comps)
  bad = [(t.domain, r.score, r.violations, r.details) for t, r in zip(tasks, results)
         if r.score != 1.0 or r.reward != 1.0]
  assert not bad, bad
  assert len({t.domain for t in tasks}) == len(sources.domains()) - len(NO_REFERENCE)


def test_no_reference_domains_still_yield_tasks_and_score_wrong_answers_zero():
  for domain in NO_REFERENCE:
    t = sources.get_source(domain).train(0)
    r = rewards.compute_reward(t, "<answer>no idea</answer>")
    assert r.score == 0.0


def test_penalties():
  cfg = rewards.RewardConfig(penalties={"format": 0.25, "timeout": 0.5})
  t = Task("math", "1+2?", "3")
  r = rewards.compute_reward(t, "no answer here", config=cfg)
  assert (r.score, r.violations, r.reward) == (0.0, ("format",), -0.25)
  # length is the RL step's business (rl.overlong_*), not the verifier's: no violation
  r = rewards.compute_reward(t, "x" * 300_000 + r"\boxed{3}", config=cfg)
  assert (r.score, r.violations, r.reward) == (1.0, (), 1.0)
  assert cfg.penalty(["format", "format", "timeout"]) == 0.75  # each counted once


def test_register_plain_callable_and_errors():
  rewards.register("test/len", lambda task, c: len(c) / 10)
  try:
    r = rewards.compute_reward(Task("test/len", "p"), "abcde")
    assert r.score == 0.5 and r.reward == 0.5
    rewards.register("test/len", lambda task, c: 1 / 0)
    r = rewards.compute_reward(Task("test/len", "p"), "abcde")
    assert r.score == 0.0 and r.violations == ("error",) and "ZeroDivisionError" in r.details["error"]
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/len", None)
  with pytest.raises(KeyError, match="rg/chain_sum"):
    rewards.compute_reward(Task("rg/chain_summ", "p"), "x")
  with pytest.raises(TypeError, match="completion 0"):
    rewards.compute_rewards([Task("math", "p", "1")], [None])
  with pytest.raises(ValueError, match="2 tasks but 1"):
    rewards.compute_rewards([Task("math", "p", "1")] * 2, ["x"])
  with pytest.raises(TypeError, match="Verifier or a callable"):
    rewards.register("x", 3)


class _Sleepy(registry.Verifier):
  """Process-isolated verifier that sleeps `task.answer` seconds, then scores 1."""
  isolation = "process"
  timeout_s = 1.0

  def verify(self, task, completion):
    time.sleep(float(task.answer))
    return RewardResult(1.0)


def test_batch_keeps_order_and_times_out_only_the_slow_sample():
  rewards.register("test/sleepy", _Sleepy())
  try:
    tasks = [Task("test/sleepy", "p", "0")] * 3 + [Task("test/sleepy", "p", "30")] + [
        Task("math", "p", str(i)) for i in range(6)]
    comps = ["x"] * 4 + [rf"\boxed{{{i if i % 2 else i + 1}}}" for i in range(6)]
    t0 = time.monotonic()
    rs = rewards.compute_rewards(tasks, comps)
    wall = time.monotonic() - t0
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/sleepy", None)
  assert [r.score for r in rs[:3]] == [1.0] * 3
  assert rs[3].violations == ("timeout",) and rs[3].score == 0.0
  assert [r.score for r in rs[4:]] == [0.0, 1.0] * 3
  assert wall < 10.0  # the 30 s sample was cut at its 1 s budget


def test_prepare_runs_once_per_task_outside_the_budget():
  """An inline verifier's `prepare` runs once per task of a batch, before any verify, and
  its time is not charged to a completion (the budget here is 0.5 s)."""

  class Slow(rewards.Verifier):
    isolation, timeout_s = "inline", 0.25

    def __init__(self):
      self.prepared = []

    def prepare(self, task):
      time.sleep(1.0)
      self.prepared.append(task.prompt)

    def verify(self, task, completion):
      assert task.prompt in self.prepared
      return RewardResult(score=1.0)
  v = Slow()
  rewards.register("test/prepared", v)
  try:
    t = Task("test/prepared", "p")
    results = rewards.compute_rewards([t, t, t], ["a", "b", "c"])
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/prepared", None)
  assert [r.score for r in results] == [1.0] * 3 and v.prepared == ["p"]


class _Raising(registry.Verifier):
  """Process-isolated verifier that raises (a bug in the worker process)."""
  isolation = "process"

  def verify(self, task, completion):
    raise KeyError("missing field")


def test_verifier_failures_are_marked_and_a_stalled_inline_verifier_raises():
  """A verifier that raises gives a result marked as no verdict (verifier_failure), in
  both isolations; an inline verifier silent past 2x its budget (its sandbox stalled)
  raises VerifierUnavailable instead of scoring the completion as a timeout."""

  class Stalled(rewards.Verifier):
    isolation, timeout_s = "inline", 0.25

    def verify(self, task, completion):
      time.sleep(3.0)
      return RewardResult(score=1.0)

  def broken(task, completion):
    raise ZeroDivisionError("bug")

  rewards.register("test/broken", broken)
  rewards.register("test/stalled", Stalled())
  rewards.register("test/raising", _Raising())
  try:
    r = rewards.compute_reward(Task("test/broken", "p"), "x")
    assert (r.score, r.violations) == (0.0, ("error",))
    assert rewards.verifier_failure(r) == "ZeroDivisionError: bug"
    r = rewards.compute_reward(Task("test/raising", "p"), "x")  # in a worker process
    assert r.score == 0.0 and "KeyError" in rewards.verifier_failure(r)
    ok = rewards.compute_reward(Task("math", "p", "2"), r"\boxed{2}")
    assert rewards.verifier_failure(ok) is None and ok.score == 1.0
    t0 = time.monotonic()
    with pytest.raises(rewards.VerifierUnavailable, match=r"'test/stalled' did not answer within 0.5 s"):
      rewards.compute_rewards([Task("test/stalled", "p")], ["x"])
    assert time.monotonic() - t0 < 2.5
  finally:
    for d in ("test/broken", "test/stalled", "test/raising"):
      rewards.VERIFIER_REGISTRY.pop(d, None)


class _Backend(rewards.Verifier):
  """An inline verifier on a backend that runs `n` at once; records its concurrency."""
  isolation, timeout_s = "inline", 1.0

  def __init__(self, name, n, hold_s=0.1, gate=None):
    self.name, self.n, self.hold_s, self.gate = name, n, hold_s, gate
    self.lock, self.now, self.peak = threading.Lock(), 0, 0

  def capacity(self):
    return ("test-backend", self.name), self.n

  def verify(self, task, completion):
    with self.lock:
      self.now += 1
      self.peak = max(self.peak, self.now)
    try:
      if self.gate is not None and completion == "stall":
        self.gate.wait(60)
      time.sleep(self.hold_s)
      return RewardResult(score=1.0)
    finally:
      with self.lock:
        self.now -= 1


def test_inline_verification_is_dispatched_by_its_backend_capacity():
  """12 verifications from two concurrent compute_rewards calls on a backend of
  capacity 3 run 3 at a time, never more (the slots are per process, not per call)."""
  v = _Backend("cap3", 3)
  rewards.register("test/cap3", v)
  try:
    out = []
    calls = [threading.Thread(target=lambda: out.extend(rewards.compute_rewards(
        [Task("test/cap3", "p")] * 6, ["x"] * 6))) for _ in range(2)]
    for c in calls:
      c.start()
    for c in calls:
      c.join(60)
    assert len(out) == 12 and all(r.score == 1.0 for r in out)
    assert v.peak == 3
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/cap3", None)


def test_a_stalled_slot_holder_raises_and_gives_its_slot_back():
  """Capacity 1 and a verification that never returns: a batch queued behind it (in
  another call) raises VerifierUnavailable once no slot moved for 2x its budget; the
  batch that holds it raises too, and frees the slot although its thread stays stuck,
  so the next batch verifies normally."""
  gate = threading.Event()
  stuck, later = _Backend("cap1", 1, hold_s=0.0, gate=gate), _Backend("cap1", 1, hold_s=0.0)
  stuck.timeout_s, later.timeout_s = 0.5, 0.1
  rewards.register("test/stuck", stuck)
  rewards.register("test/later", later)
  errors = []

  def holder():
    try:
      rewards.compute_rewards([Task("test/stuck", "p")] * 2, ["stall", "x"])
    except rewards.VerifierUnavailable as e:
      errors.append(str(e))

  try:
    t = threading.Thread(target=holder)
    t.start()
    deadline = time.monotonic() + 10
    while stuck.now == 0 and time.monotonic() < deadline:
      time.sleep(0.01)
    with pytest.raises(rewards.VerifierUnavailable, match=r"no slot of verification backend "
                       r"\('test-backend', 'cap1'\) \(1 at once\) was freed within 0.2 s"):
      rewards.compute_rewards([Task("test/later", "p")], ["x"])
    t.join(20)
    assert len(errors) == 1 and "'test/stuck' did not answer within 1 s" in errors[0], errors
    assert stuck.now == 1   # its verify is still stuck, its slot is free again
    assert [r.score for r in rewards.compute_rewards([Task("test/later", "p")] * 3,
                                                     ["x"] * 3)] == [1.0] * 3
  finally:
    gate.set()
    rewards.VERIFIER_REGISTRY.pop("test/stuck", None)
    rewards.VERIFIER_REGISTRY.pop("test/later", None)


def test_code_verification_uses_the_warm_sandboxes_it_has():
  """8 code verifications on a pool of 2 warm sandboxes run 2 at a time on them: the
  pool boots its 2 containers and no more (16 threads at once made it boot one for
  every waiting run)."""
  from rlpt.data.sources import code_tasks
  from rlpt.sandbox import pool as pool_lib
  saved = pool_lib._default
  pool_lib._default = pool = pool_lib.SandboxPool(2, reuse=1000)
  try:
    task = code_tasks._task(code_tasks.problems()[0], "train")
    ref = code_tasks.CodeSource().reference(task)
    res = rewards.compute_rewards([task] * 8, [ref] * 8)
    assert [r.score for r in res] == [1.0] * 8
    assert (pool.stats.boots, pool.stats.cold_boots, pool.stats.runs) == (2, 0, 8), pool.stats
  finally:
    pool_lib._default = saved
    pool.close()
