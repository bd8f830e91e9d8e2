"""Holdout evaluation: one batch of distinct prompts, per-task outcomes and intervals;
verifier failures retried and never scored."""

import collections

import numpy as np
import pytest

from rlpt.rewards import registry, synthetic
from rlpt.rollout.engine import Completion, SamplingParams
from rlpt.train import evaluation, intervals, scheduler
from rlpt.types import Task


class _RecordingEngine:
  """Answers each prompt with a fixed text and records what it was asked (the
  RolloutEngine surface evaluate uses: generate)."""

  def __init__(self, answers):
    self.answers, self.calls = answers, []

  def generate(self, requests):
    self.calls.append([r.messages[-1]["content"] for r in requests])
    out = []
    for r in requests:
      assert r.sampling.temperature == 0.0 and r.n == 1
      text = self.answers[r.messages[-1]["content"]]
      out.append(Completion(request_id=r.request_id, sample_index=0, prompt_ids=[1],
                            token_ids=[5], text=text, logprobs=[-0.1],
                            sampling_logprobs=[0.0], finish_reason="stop", weight_version=0))
    return out


def test_repeated_tasks_are_decoded_once_and_counted_each_time():
  holdout = {"synthetic": [Task("synthetic", "12=", "12"), Task("synthetic", "7=", "7"),
                           Task("synthetic", "12=", "12"), Task("synthetic", "3=", "3")]}
  engine = _RecordingEngine({"12=": "12", "7=": "9", "3=": "3"})
  ev = evaluation.evaluate(engine, holdout, max_new_tokens=4)
  assert len(engine.calls) == 1 and sorted(engine.calls[0]) == ["12=", "3=", "7="]
  e = ev["synthetic"]
  assert e["correct"] == [1, 0, 1, 1] and e["n"] == 4
  np.testing.assert_allclose(e["accuracy"], 0.75)
  assert e["low"] < 0.75 < e["high"]
  before = dict(e, correct=[0, 0, 1, 1])
  g = evaluation.gain(e, before)
  np.testing.assert_allclose(g.estimate, 0.25)
  assert evaluation.gain(e, {"accuracy": 0.5}) is None  # an evals.json without outcomes


@pytest.fixture
def replaced_synthetic():
  saved = dict(registry.VERIFIER_REGISTRY)
  yield lambda fn: registry.register("synthetic", registry.FunctionVerifier(fn))
  registry.VERIFIER_REGISTRY.clear()
  registry.VERIFIER_REGISTRY.update(saved)


def test_verifier_failures_are_retried_then_left_unscored_never_counted_wrong(
    replaced_synthetic):
  calls = collections.Counter()

  def flaky(task, completion):
    calls[task.prompt] += 1
    if task.prompt == "7=" and calls["7="] == 1:
      raise RuntimeError("flaky once")
    if task.prompt == "3=":
      raise RuntimeError("always broken")
    return synthetic.verify(task, completion)

  replaced_synthetic(flaky)
  holdout = {"synthetic": [Task("synthetic", "12=", "12"), Task("synthetic", "7=", "7"),
                           Task("synthetic", "3=", "3"), Task("synthetic", "4=", "4")]}
  engine = _RecordingEngine({"12=": "12", "7=": "7", "3=": "3", "4=": "5"})
  ev = evaluation.evaluate(engine, holdout, max_new_tokens=4, backoff_s=0.0)
  e = ev["synthetic"]
  assert calls == {"12=": 1, "7=": 2, "3=": 3, "4=": 1}   # only failures are re-verified
  assert e["correct"] == [1, 1, None, 0] and e["n"] == 3 and e["unscored"] == 1
  np.testing.assert_allclose(e["accuracy"], 2 / 3)
  assert e["errors"] == ["RuntimeError: always broken"]
  # the paired gain compares the tasks scored in both evaluations (12=, 4=)
  before = dict(e, correct=[0, None, 1, 0])
  g = evaluation.gain(e, before)
  np.testing.assert_allclose(g.estimate, 0.5)
  ref = intervals.paired_gain([1, 0], [0, 0])
  assert (g.low, g.high) == (ref.low, ref.high)


def test_an_unavailable_verifier_is_retried_then_raised(replaced_synthetic):
  calls, sleeps = [], []

  def down(task, completion):
    calls.append(task.prompt)
    raise registry.VerifierUnavailable("the sandbox pool is gone")

  replaced_synthetic(down)
  holdout = {"synthetic": [Task("synthetic", "12=", "12")]}
  engine = _RecordingEngine({"12=": "12"})
  with pytest.raises(registry.VerifierUnavailable, match="sandbox pool is gone"):
    evaluation.evaluate(engine, holdout, max_new_tokens=4, backoff_s=0.0)
  assert calls == ["12=", "12=", "12="]
  # the backoff doubles between tries
  rollouts = scheduler.to_rollouts(holdout["synthetic"], engine.generate(
      scheduler.requests_for(holdout["synthetic"], n=1, sampling=SamplingParams(
          max_new_tokens=4, temperature=0.0), seeds=[0])), n=1)
  with pytest.raises(registry.VerifierUnavailable):
    evaluation.verify_holdout(rollouts, attempts=4, backoff_s=0.5, sleep=sleeps.append)
  assert sleeps == [0.5, 1.0, 2.0] and rollouts[0].reward is None


def _smoke_parts(engine_kind, eval_engine, rollout_engine):
  from configs import smoke
  from rlpt.train import build, policy
  from rlpt.train.settings import Settings
  c = smoke.get_config()
  c.rollout.engine, c.eval.engine = rollout_engine, eval_engine
  s = Settings.from_config(c)
  src = build.task_source("synthetic", s.data, seed=0)
  models = [policy.load_policy(s.model, seed=seed, synthetic_ops=(src.ops,)) for seed in (0, 1)]
  parts = build.Parts(settings=s, model=models[0][0], tokenizer=models[0][1], engine=engine_kind,
                      mixer=None, sources={"synthetic": src}, holdout={}, mesh=None, pad_id=0)
  return parts, models, src


def _greedy(engine, tasks):
  from rlpt.train import generation
  comps = generation.generate(engine, tasks, n=1, sampling=SamplingParams(max_new_tokens=2,
                                                                          temperature=0.0),
                              seeds=[0] * len(tasks))
  return [np.asarray(r.logprobs) for r in comps]


def test_the_learners_eval_engine_serves_the_parameters_it_is_handed():
  """eval.engine = "learner" with the fleet: an embedded engine in this process that
  decodes exactly what a fresh engine of the handed parameters decodes, as the handed
  version, built once; otherwise the rollout engine itself."""
  from flax import nnx
  from rlpt.rollout.jax_engine import JaxEngine
  from rlpt.train import build
  fleet = object()   # stands for the Fleet: the learner's engine must never call it
  parts, models, src = _smoke_parts(fleet, "learner", "fleet")
  tasks = src.holdout(6)
  ev = build.EvalEngine(parts)
  assert ev.separate
  other = models[1][0]
  engine = ev.serving(nnx.state(other), version=5)
  assert engine is not fleet and engine.weight_version == 5
  fresh = JaxEngine(other, models[1][1], parts.settings.engine_config())
  got, want = _greedy(engine, tasks), _greedy(fresh, tasks)
  base = _greedy(JaxEngine(models[0][0], models[0][1], parts.settings.engine_config()), tasks)
  for g, w, b in zip(got, want, base):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  assert any(g.shape != b.shape or not np.allclose(g, b, atol=1e-3) for g, b in zip(got, base))
  assert ev.serving(parts.model, version=6) is engine and engine.weight_version == 6
  for kind, rollout in (("learner", "jax"), ("rollout", "fleet")):
    p, _, _ = _smoke_parts(fleet, kind, rollout)
    assert build.EvalEngine(p).serving(nnx.state(other), version=5) is fleet
