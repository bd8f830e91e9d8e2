"""The round scheduler's failure table, done for real: a verifier that raises once is
verified again and trained, one that always raises is dead-lettered (WORKDIR/dead_letter/,
the mixer stops drawing the task), a prompt past the context and a task whose reference
fails are dead-lettered before generation, and a sandbox whose runsc processes are
SIGKILLed mid-verification is retried, never scored."""

import collections
import json
import shutil
import threading
import time

import numpy as np
import psutil
import pytest

from configs import smoke
from rlpt.data import trajectories as traj_lib
from rlpt.rewards import registry
from rlpt.rollout.client import SGLangRequestError
from rlpt.rollout.engine import Completion, RolloutEngine, SamplingParams
from rlpt.rollout.fleet_members import FleetError, MemberDown
from rlpt.train import rl_loop
from rlpt.train import scheduler as sched
from rlpt.types import Task, task_key


def test_every_failure_kind_has_a_class_and_exceptions_map_onto_the_table():
  assert set(sched.FAILURES) == {"engine_unavailable", "sandbox_lost", "verifier_unavailable",
                                 "verifier_raised", "verifier_raised_twice", "prompt_too_long",
                                 "reference_fails"}
  classes = {k: sched.failure_class(k) for k in sched.FAILURES}
  assert {k for k, c in classes.items() if c == sched.TRANSIENT} == {
      "engine_unavailable", "sandbox_lost", "verifier_unavailable", "verifier_raised"}
  assert {k for k, c in classes.items() if c == sched.DETERMINISTIC} == {
      "verifier_raised_twice", "prompt_too_long", "reference_fails"}
  c = sched.classify_exception
  assert c(registry.VerifierUnavailable("sandbox")) == "verifier_unavailable"
  assert c(FleetError("all down")) == c(MemberDown("m0")) == "engine_unavailable"
  assert c(ConnectionError("refused")) == c(TimeoutError()) == "engine_unavailable"
  assert c(SGLangRequestError(400, "bad field", "http://x")) is None  # a bad request: no retry
  assert c(ValueError("a bug")) is None
  with pytest.raises(KeyError):
    sched.failure_class("nope")


class _ReplayEngine(RolloutEngine):
  """Answers every sample of a request with a fixed text per prompt (the policy is not
  what these tests exercise); counts its calls; can fail its first `fail` calls."""

  def __init__(self, texts, fail=0):
    self.texts, self.fail, self.calls = texts, fail, 0
    self.tokenizer = None

  @property
  def weight_version(self):
    return 0

  def update_weights(self, source, version):
    raise NotImplementedError

  def generate(self, requests):
    self.calls += 1
    if self.calls <= self.fail:
      raise ConnectionError("member 0: connection refused")
    return [Completion(request_id=r.request_id, sample_index=i, prompt_ids=[1], token_ids=[2],
                       text=self.texts[r.messages[0]["content"]], logprobs=[-0.5],
                       sampling_logprobs=[-0.5], finish_reason="stop", weight_version=0)
            for r in requests for i in range(r.n)]


def _scheduler(engine, sources=None, *, attempts=3, sleeps=None, tokenizer=None,
               max_prompt_len=10_000, check_references=True):
  return sched.Scheduler(
      sched.SchedulerSettings(max_attempts=attempts, backoff_s=0.25,
                              check_references=check_references),
      engine, sources or {}, tokenizer, max_prompt_len=max_prompt_len,
      sleep=(sleeps.append if sleeps is not None else time.sleep))


def test_generation_failures_are_retried_with_backoff_then_raised():
  tasks = [Task("math", "What is 2+3?", "5")]
  sleeps = []
  rnd = _scheduler(_ReplayEngine({tasks[0].prompt: r"\boxed{5}"}, fail=2), sleeps=sleeps).run(
      tasks, [1], n=2, sampling=SamplingParams(max_new_tokens=4), first_group=7)
  assert sleeps == [0.25, 0.5]  # exponential backoff between the 3 attempts
  assert [(r.attempt, r.finish_reason, e.split(":")[0]) for r, e in rnd.retried] == [
      (1, "not_generated", "engine_unavailable"), (2, "not_generated", "engine_unavailable")]
  [(gid, members)] = rnd.groups
  assert gid == 7 and [r.reward.score for r in members] == [1.0, 1.0]
  assert [r.attempt for r in members] == [3, 3]  # the third generation
  assert rnd.counts == {"engine_unavailable": 2}
  with pytest.raises(sched.SchedulerError, match=r"generation failed 3 times"):
    _scheduler(_ReplayEngine({tasks[0].prompt: "5"}, fail=3), sleeps=[]).run(
        tasks, [1], n=2, sampling=SamplingParams(max_new_tokens=4), first_group=0)


class _Source:
  def __init__(self, refs):
    self.refs = refs

  def reference(self, task):
    return self.refs.get(task.prompt)


def test_too_long_prompts_and_failing_references_are_dead_lettered_before_generation():
  from rlpt.models.tokenizer import CharTokenizer
  ok = Task("math", "What is 2+3?", "5")
  broken = Task("math", "What is 2+2?", "5")          # its own reference scores 0
  long = Task("math", "What is 1+1? " * 40, "2")
  engine = _ReplayEngine({ok.prompt: r"\boxed{5}"})
  s = _scheduler(engine, {"math": _Source({ok.prompt: r"\boxed{5}", broken.prompt: r"\boxed{4}",
                                           long.prompt: r"\boxed{2}"})},
                 tokenizer=CharTokenizer(sorted(set("What is 0123456789+? "))),
                 max_prompt_len=100)
  rnd = s.run([ok, broken, long], [1, 2, 3], n=2, sampling=SamplingParams(max_new_tokens=4),
              first_group=0)
  assert [g for g, _ in rnd.groups] == [0]
  dead = {d.group_id: d for d in rnd.dead}
  assert dead[1].kind == "reference_fails" and "scored 0" in dead[1].reason
  assert dead[2].kind == "prompt_too_long" and "> rollout.max_prompt_len = 100" in dead[2].reason
  assert [r.finish_reason for d in rnd.dead for r in d.rollouts] == ["not_generated"] * 2
  assert engine.calls == 1  # only the admitted task was generated
  assert rnd.counts == {"reference_fails": 1, "prompt_too_long": 1}
  # the verdicts are cached per task: a second round generates without checking again
  rnd2 = s.run([broken, ok], [4, 5], n=2, sampling=SamplingParams(max_new_tokens=4),
               first_group=3)
  assert [d.kind for d in rnd2.dead] == ["reference_fails"] and [g for g, _ in rnd2.groups] == [4]


@pytest.fixture
def replaced_verifier():
  """Registers a verifier for a domain for one test, then puts the original back."""
  saved = dict(registry.VERIFIER_REGISTRY)
  yield registry.register
  registry.VERIFIER_REGISTRY.clear()
  registry.VERIFIER_REGISTRY.update(saved)


def test_a_verifier_that_raises_once_is_verified_again_and_twice_is_dead_lettered(
    replaced_verifier):
  seen, lock = collections.Counter(), threading.Lock()

  def flaky(task, completion):
    with lock:
      seen[completion] += 1
      first = seen[completion] == 1
    if completion == "always" or (completion == "once" and first):
      raise RuntimeError(f"verifier bug on {completion!r}")
    return 1.0 if completion == task.answer else 0.0

  replaced_verifier("test/flaky", flaky)
  tasks = [Task("test/flaky", "a", "once"), Task("test/flaky", "b", "always"),
           Task("test/flaky", "c", "x")]
  engine = _ReplayEngine({"a": "once", "b": "always", "c": "y"})
  sleeps = []
  rnd = _scheduler(engine, sleeps=sleeps).run(tasks, [1, 2, 3], n=1,
                                              sampling=SamplingParams(max_new_tokens=4),
                                              first_group=0)
  assert [g for g, _ in rnd.groups] == [0, 2]
  assert rnd.groups[0][1][0].reward.score == 1.0 and rnd.groups[0][1][0].attempt == 2
  assert rnd.groups[1][1][0].reward.score == 0.0 and rnd.groups[1][1][0].attempt == 1
  [d] = rnd.dead
  assert (d.group_id, d.kind) == (1, "verifier_raised_twice")
  assert "RuntimeError: verifier bug on 'always'" in d.reason
  assert d.rollouts[0].reward is None  # never scored
  assert sorted((r.group_id, r.attempt) for r, _ in rnd.retried) == [(0, 1), (1, 1)]
  assert all(e.startswith("verifier_raised: RuntimeError") for _, e in rnd.retried)
  assert rnd.counts == {"verifier_raised": 2, "verifier_raised_twice": 1}
  assert sleeps == [0.25]


def test_mixer_never_draws_an_excluded_task_again_and_the_state_keeps_it():
  from rlpt.data.mixer import DomainMixer
  from rlpt.data.synthetic import SyntheticSource
  src = SyntheticSource(length=(1, 1), seed=0)
  m = DomainMixer({"synthetic": src}, {"synthetic": 1.0}, seed=3)
  first = m.sample(40)
  victim = first[0]
  m2 = DomainMixer({"synthetic": src}, {"synthetic": 1.0}, seed=3)
  m2.exclude(victim)
  state = m2.get_state()
  assert state["excluded"] == [task_key(victim)]
  drawn = m2.sample(200)
  assert task_key(victim) not in {task_key(t) for t in drawn}
  m3 = DomainMixer({"synthetic": src}, {"synthetic": 1.0}, seed=3)
  m3.set_state(state)  # the exclusion comes back with the state: the same draws
  assert [t.prompt for t in m3.sample(200)] == [t.prompt for t in drawn]


def test_the_rl_loop_records_retries_and_dead_letters_and_stops_drawing_the_task(
    tmp_path, replaced_verifier):
  """configs/smoke.py through the real loop with a verifier that raises once on every
  completion of prompt "3=" and always on prompt "5=": the "3=" groups train (attempt 2),
  the "5=" ones go to dead_letter/ and are drawn in one step at most."""
  from rlpt.rewards.synthetic import verify as synthetic_verify
  seen, lock = collections.Counter(), threading.Lock()

  def faulty(task, completion):
    key = (task.prompt, completion)
    with lock:
      seen[key] += 1
      first = seen[key] == 1
    if task.prompt == "5=" or (task.prompt == "3=" and first):
      raise RuntimeError("injected verifier failure")
    return synthetic_verify(task, completion)

  replaced_verifier("synthetic", registry.FunctionVerifier(faulty))
  c = smoke.get_config()
  c.total_steps = 3
  c.eval.every = 0
  rl_loop.train(c, str(tmp_path))
  t = traj_lib.read_trajectories(str(tmp_path / "trajectories")).to_pylist()
  retried = [r for r in t if r["outcome"] == "retried"]
  assert retried and {r["attempt"] for r in retried} == {1}
  assert all(r["error"].startswith("verifier_raised: RuntimeError: injected") for r in retried)
  used = [r for r in t if r["outcome"] in ("trained", "filtered")]
  # each failed verification was verified again: one attempt-2 row per retried record
  # (the "5=" ones failed again and were dead-lettered at attempt 2)
  assert {r["prompt"] for r in retried} == {"3=", "5="}
  again = sorted((r["group_id"], r["completion_text"]) for r in used if r["attempt"] == 2)
  assert again == sorted((r["group_id"], r["completion_text"]) for r in retried
                         if r["prompt"] == "3=")
  assert all(r["prompt"] != "5=" and np.isfinite(r["score"]) for r in used)
  dead = traj_lib.read_trajectories(str(tmp_path / "dead_letter")).to_pylist()
  assert dead and {r["prompt"] for r in dead} == {"5="}
  assert all(np.isnan(r["score"]) and r["attempt"] == 2 for r in dead)
  assert all(r["error"].startswith("verifier_raised_twice: RuntimeError: injected") for r in dead)
  assert len({r["step"] for r in dead}) == 1  # excluded after the step that met it
  # the loop's own trajectory files hold the same rows; the metrics count the groups
  assert len([r for r in t if r["outcome"] == "dead_letter"]) == len(dead)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert sum(r["dead_letter_groups"] for r in rows) == len({r["group_id"] for r in dead})
  assert all(np.isfinite(r["loss"]) for r in rows)


def _kill_runsc_descendants(stop: threading.Event, killed: list) -> None:
  """SIGKILLs this process's runsc sandbox processes (a crashed gVisor) until `stop`."""
  me = psutil.Process()
  while not stop.is_set():
    for p in me.children(recursive=True):
      try:
        if "runsc-sandbox" in " ".join(p.cmdline()):
          p.kill()
          killed.append(p.pid)
      except psutil.Error:
        pass
    time.sleep(0.02)


@pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc not installed")
def test_a_sandbox_killed_mid_verification_is_retried_not_scored(replaced_verifier):
  """HumanEval code verified in gVisor while a thread SIGKILLs every runsc sandbox process
  of this test (a sentry crash loop): the pool's own retry dies too and the verifier
  stalls, so compute_rewards raises VerifierUnavailable (never a "timeout" score); the
  scheduler records the attempt and backs off (the killing stops there), and the next
  attempt scores the canonical solution 1 and a wrong one 0."""
  from rlpt.data.sources.code_tasks import CodeSource
  from rlpt.rewards.code_verifier import CodeVerifier
  replaced_verifier("code", CodeVerifier(timeout_s=4.0))  # a 8 s stall budget, not 20 s
  src = CodeSource(seed=0)
  task = src.train(0)
  slow = src.reference(task).replace("```python\n", "```python\nimport time\ntime.sleep(1.0)\n", 1)
  stop, killed = threading.Event(), []
  killer = threading.Thread(target=_kill_runsc_descendants, args=(stop, killed), daemon=True)
  sleeps = []

  def backoff(seconds):
    sleeps.append(seconds)
    stop.set()
    killer.join()

  wrong = Task(task.domain, task.prompt + " ", task.answer, task.metadata)
  engine = _ReplayEngine({task.prompt: slow, wrong.prompt: "```python\ndef f():\n  pass\n```"})
  s = sched.Scheduler(sched.SchedulerSettings(max_attempts=3, backoff_s=0.5,
                                              check_references=False),
                      engine, {}, None, max_prompt_len=10_000, sleep=backoff)
  killer.start()
  try:
    rnd = s.run([task, wrong], [1, 2], n=1, sampling=SamplingParams(max_new_tokens=4),
                first_group=0)
  finally:
    stop.set()
  assert killed, "the test killed no sandbox"
  assert sleeps == [0.5]
  assert rnd.counts == {"verifier_unavailable": 1}
  assert [(r.group_id, r.attempt) for r, _ in rnd.retried] == [(0, 1), (1, 1)]
  assert all(e.startswith("verifier_unavailable: ") for _, e in rnd.retried)
  assert [(g, m[0].reward.score) for g, m in rnd.groups] == [(0, 1.0), (1, 0.0)]
  assert all(m[0].attempt == 2 for _, m in rnd.groups)  # the second verification
