"""Episodic domains in the RL step: a round mixing single-turn and python_tool tasks
comes back as groups of n, the episodes token-exact with their turns and final state,
scored by the domain's verifier with the episode's own rules; a sandbox session that
dies is retried, never scored; evaluation plays the same episodes with and without
the tool."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

from rlpt.data import sources
from rlpt.envs import episode as ep_lib
from rlpt.envs import registry as env_registry
from rlpt.envs.base import EnvStep, Environment
from rlpt.models.gguf_file import GGUFFile
from rlpt.models.loading import resolve_path
from rlpt.models.tokenizer import Tokenizer
from rlpt.rewards import registry
from rlpt.rollout.engine import Completion, RolloutEngine, SamplingParams
from rlpt.sandbox import SessionLost
from rlpt.train import evaluation, generation
from rlpt.train.batch import episode_metrics
from rlpt.train import scheduler as sched
from rlpt.types import Task

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sandbox"))
import sandbox_helpers  # noqa: E402

_RESPONSE = re.compile(r"<tool_response>\s*(-?\d+)", re.S)


@pytest.fixture(scope="module")
def tok():
  path = resolve_path("smollm2-135m-instruct")
  return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=path)


class ToolUser(RolloutEngine):
  """A scripted policy: on an episode's first turn it calls `python` with the task's
  expression, after a tool result it answers with the number it read (0 if none);
  a single-turn request gets `\\boxed{3}`. Turn by turn (no KV reuse)."""

  def __init__(self, tok, expressions):
    self.tokenizer, self.expressions, self.calls = tok, dict(expressions), 0

  @property
  def weight_version(self):
    return 3

  def update_weights(self, source, version):
    raise NotImplementedError

  def generate(self, requests):
    self.calls += 1
    out = []
    for r in requests:
      for i in range(r.n):
        if r.messages:
          text, prompt = "\\boxed{3}", [1, 2]
        else:
          prompt = list(r.prompt_ids)
          seen = self.tokenizer.decode(prompt)
          found = _RESPONSE.findall(seen)
          if seen.count("<tool_response>") > 1:  # the system message names it once
            text = f"<answer>{found[-1] if found else 0}</answer>"
          else:
            expr = next(e for p, e in self.expressions.items() if p in seen)
            text = f'<tool_call>\n{{"name": "python", "arguments": {{"code": "print({expr})"}}}}\n</tool_call>'
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        out.append(Completion(r.request_id, i, prompt, ids, text, [-0.25] * len(ids),
                              [-0.25] * len(ids), "stop", 3))
    return out


def _tasks(n):
  src = sources.get_source("python_tool", seed=1)
  return [src.train(i) for i in range(n)]


def _scheduler(engine, tok, episodes=None, sleep=None):
  return sched.Scheduler(sched.SchedulerSettings(backoff_s=0.0), engine, {}, tok,
                         max_prompt_len=512, episodes=episodes,
                         sleep=sleep or (lambda s: None))


@pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")
def test_a_round_of_episodes_and_single_turn_groups(tok):
  tasks = _tasks(2)
  mixed = [tasks[0], Task("math", "1+2?", "3"), tasks[1]]
  engine = ToolUser(tok, {t.prompt: t.metadata["expression"] for t in tasks})
  rnd = _scheduler(engine, tok).run(mixed, [11, 12, 13], n=2,
                                    sampling=SamplingParams(max_new_tokens=64), first_group=5)
  assert not rnd.dead and not rnd.retried
  assert [g for g, _ in rnd.groups] == [5, 6, 7]
  for (g, members), task in zip(rnd.groups, mixed):
    assert len(members) == 2 and all(r.task == task and r.group_id == g for r in members)
    assert all(r.reward.score == 1.0 and r.reward.reward == 1.0 for r in members), members
  for _, members in (rnd.groups[0], rnd.groups[2]):
    for r in members:
      assert len(r.turns) == 2 and r.turns[0]["tools"][0]["exit_code"] == 0
      assert r.verified_text == r.turns[-1]["text"] == f"<answer>{r.task.answer}</answer>"
      mask = r.completion_mask
      assert len(mask) == len(r.completion_ids) == len(r.logprobs)
      assert mask[0] and not all(mask) and mask[-1]   # model, tool result (masked), model
      assert all(lp == 0.0 for lp, m in zip(r.logprobs, mask) if not m)
      assert r.weight_version == 3 and r.finish_reason == "stop"
  m = episode_metrics([r for _, g in rnd.groups for r in g])
  assert (m["episode/count"], m["episode/turns"], m["episode/tool_calls"]) == (4, 2, 1)
  assert m["episode/truncated_frac"] == m["episode/call_violation_frac"] == 0.0
  assert m["episode/tool_s"] > 0
  single = rnd.groups[1][1]
  assert all(r.turns is None and r.verified_text is None and r.completion_mask is None
             for r in single)


class _Dying(Environment):
  """An environment whose sandbox dies at its first step, the first `die` times."""
  died = 0

  def __init__(self, die):
    self.die = die

  def reset(self, task):
    return [{"role": "user", "content": task.prompt}]

  def step(self, text):
    if _Dying.died < self.die:
      _Dying.died += 1
      raise SessionLost("the session's sandbox failed: runsc killed")
    return EnvStep(done=True)

  def completion(self):
    return "ok"


def test_a_lost_session_is_retried_and_never_scored(tok, monkeypatch):
  monkeypatch.setitem(env_registry._SPECS, "test/dying",
                      env_registry.EnvSpec(make=lambda pool, limits, with_tools=True: _Dying(1)))
  monkeypatch.setitem(registry.VERIFIER_REGISTRY, "test/dying",
                      registry.FunctionVerifier(lambda t, c: float(c == "ok")))
  _Dying.died = 0
  assert sched.classify_exception(SessionLost("x")) == "sandbox_lost"
  assert sched.failure_class("sandbox_lost") == sched.TRANSIENT
  engine = ToolUser(tok, {})
  engine.generate = lambda reqs, _g=engine.generate: [
      Completion(r.request_id, 0, list(r.prompt_ids), [5, tok.eos_token_id], "done", [-1.0] * 2,
                 [-1.0] * 2, "stop", 3) for r in reqs]
  waits = []
  rnd = _scheduler(engine, tok, sleep=waits.append).run(
      [Task("test/dying", "go", None)], [1], n=2, sampling=SamplingParams(max_new_tokens=8),
      first_group=0)
  assert rnd.counts["sandbox_lost"] == 1 and len(waits) == 1
  assert [r.finish_reason for r, _ in rnd.retried] == ["not_generated"]
  assert "sandbox_lost" in rnd.retried[0][1]
  (_, members), = rnd.groups
  assert [r.reward.score for r in members] == [1.0, 1.0] and all(r.attempt == 2 for r in members)
  # past max_attempts the run stops rather than score anything
  _Dying.died = -10
  with pytest.raises(sched.SchedulerError, match="sandbox_lost"):
    _scheduler(engine, tok).run([Task("test/dying", "go", None)], [1], n=1,
                                sampling=SamplingParams(max_new_tokens=8), first_group=0)


def test_caps_truncate_an_episode_and_zero_its_reward(tok):
  """Without the tool (no sandbox needed), the call is answered with an error; one
  turn allowed: the episode is cut, flagged on its last turn and scored 0."""
  t = _tasks(1)[0]
  engine = ToolUser(tok, {t.prompt: t.metadata["expression"]})
  eps = generation.EpisodeSettings(caps=ep_lib.EpisodeCaps(max_turns=1), with_tools=False)
  (r,) = generation.generate(engine, [t], n=1, sampling=SamplingParams(max_new_tokens=64),
                             seeds=[0], episodes=eps)
  assert r.finish_reason == "length" and r.turns[-1]["truncated"] == "max_turns"
  (v,) = registry.compute_rewards([t], [r.scored_text])
  (scored,) = generation.finish([r], [v], eps)
  assert scored.reward == 0.0 and scored.details["truncated"] == "max_turns"
  assert "tool_call" in scored.violations
  m = episode_metrics([r])
  assert m["episode/truncated_frac"] == m["episode/call_violation_frac"] == 1.0
  assert episode_metrics([]) == {}


@pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")
def test_evaluation_plays_the_holdout_with_and_without_the_tool(tok):
  hold = sources.get_source("python_tool", seed=1).holdout(3)
  engine = ToolUser(tok, {t.prompt: t.metadata["expression"] for t in hold})
  on = evaluation.evaluate(engine, {"python_tool": hold}, max_new_tokens=64,
                           episodes=generation.EpisodeSettings())
  off = evaluation.evaluate(engine, {"python_tool": hold}, max_new_tokens=64,
                            episodes=generation.EpisodeSettings(with_tools=False))
  assert on["python_tool"]["accuracy"] == 1.0 and on["python_tool"]["n"] == 3
  assert off["python_tool"]["accuracy"] == 0.0 and off["python_tool"]["n"] == 3


def test_the_agentic_config_sizes_the_engine_for_whole_episodes_and_checks_the_template(tok):
  from configs import agentic_python_tool
  from rlpt.train import build, settings, sft
  c = agentic_python_tool.get_config()
  s = settings.Settings.from_config(c)
  assert s.episodes.caps.max_turns == 3 and s.episodes.tools.max_calls == 2
  assert s.engine_config().max_len >= s.episodes.caps.max_context_tokens
  build.check_episodic_template(s)  # SmolLM2's template renders tool turns (the fallback)
  c.model.name = "tiny"
  with pytest.raises(settings.ConfigError, match="episodic domains .*python_tool.*chat template"):
    build.check_episodic_template(settings.Settings.from_config(c))
  c = agentic_python_tool.get_config()
  c.episodes.max_turns = 0
  with pytest.raises(settings.ConfigError, match="episodes.max_turns"):
    settings.Settings.from_config(c)
  # the SFT warm-up demonstrates whole episodes: model turns trained, the tool turn not
  src = sources.get_source("python_tool")
  demos = sft._demo_stream({"python_tool": src}, tok, s.sft, offset=0)
  for _ in range(4):
    prompt, ids, mask = next(demos)
    assert len(prompt) + len(ids) <= s.sft.max_len and mask[0] and mask[-1] and not all(mask)
    assert "<tool_response>" in tok.decode([i for i, m in zip(ids, mask) if not m])
    assert "<tool_response>" not in tok.decode([i for i, m in zip(ids, mask) if m])
