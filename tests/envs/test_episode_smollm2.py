"""Multi-turn episodes with the real SmolLM2 weights through JaxEngine: the learner
scores the episode's rows at the logprobs the engine recorded (gap ~ 0 on model
tokens), and a python_tool episode runs its tool call in a real sandbox."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from rlpt.algorithms import AlgoSpec
from rlpt.envs import episode as ep_lib
from rlpt.envs import tool_calls
from rlpt.envs.python_tool import PythonToolEnv
from rlpt.models import load_model
from rlpt.rollout import JaxEngine, JaxEngineConfig, SamplingParams
from rlpt.train.batch import pack_rows
from rlpt.train.learner import Learner, metrics_to_host
from rlpt.train.optim import OptimConfig
from rlpt.types import Task

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sandbox"))
import sandbox_helpers  # noqa: E402
from episode_helpers import Echo, Scripted  # noqa: E402


@pytest.fixture(scope="module")
def smollm2():
  model, tok = load_model("smollm2-135m-instruct")
  engine = JaxEngine(model, tok, JaxEngineConfig(max_batch=8, max_len=512, kv_cache_mib=64,
                                                 min_prompt_bucket=32))
  return model, tok, engine


def test_the_learner_scores_multi_turn_rows_at_the_sampled_logprobs(smollm2):
  model, tok, engine = smollm2
  tasks = [Task("math", "What is 12 + 30?", answer="42"), Task("math", "Name a prime.", "7")]
  def run(kv_reuse):
    return ep_lib.run_episodes(
        engine, ep_lib.Renderer(tok), [Echo(rounds=2), Echo(rounds=2)], tasks,
        sampling=SamplingParams(max_new_tokens=12, temperature=1.0, seed=5),
        caps=ep_lib.EpisodeCaps(max_context_tokens=400), kv_reuse=kv_reuse)

  eps = run(True)
  assert engine.last_stats.extensions == 4  # two environment turns each, from the cache
  for e in eps:
    assert len(e.turns) == 3 and e.done and not e.truncated
    assert sum(e.mask) < len(e.ids)  # environment tokens are in the row, masked
  # re-prefilling the history every turn samples the same tokens at the same logprobs
  again = run(False)
  assert engine.last_stats.extensions == 0
  for e, f in zip(eps, again):
    assert e.ids == f.ids and e.mask == f.mask
    np.testing.assert_allclose(e.logprobs, f.logprobs, atol=2e-3)
  rows = pack_rows([e.to_rollout(group_id=0) for e in eps], np.array([1.0, 0.0], np.float32),
                   pad_id=0, length_multiple=32)
  lrn = Learner(model, AlgoSpec(), OptimConfig(lr=1e-6), microbatch_size=2)
  batch = lrn.prepare(rows.tokens, rows.attention_mask, rows.loss_mask, rows.old_logprobs,
                      rows.rewards, group_size=2, pad_multiple=32)
  m = metrics_to_host(lrn.step(batch))
  assert m["logprob_gap_max"] < 2e-3, m  # float32 on CPU: the same tokens, the same logprobs
  assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")
def test_a_python_tool_episode_runs_the_call_in_the_sandbox(smollm2):
  _, tok, _ = smollm2
  task = Task("math", "What is 4821 * 7394?", answer=str(4821 * 7394))
  call = tool_calls.format_call("python", {"code": "print(4821 * 7394)"})
  turns = [tok.encode(f"Let me compute it.\n{call}", add_special_tokens=False),
           tok.encode(f"<answer>{4821 * 7394}</answer>", add_special_tokens=False)]
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    envs = [PythonToolEnv(pool)]
    (e,) = ep_lib.run_episodes(Scripted(tok, turns), ep_lib.Renderer(tok), envs, [task],
                               sampling=SamplingParams(max_new_tokens=64),
                               caps=ep_lib.EpisodeCaps())
    assert envs[0]._session is None  # closed: the container went back to the pool
  (rec,) = e.turns[0].records
  assert rec.tool == "python" and rec.exit_code == 0 and rec.output.startswith(
      str(4821 * 7394)), rec
  assert f"<tool_response>\n{4821 * 7394}\n" in tok.decode(e.ids)
  assert e.reward.score == 1.0 and e.reward.violations == ()
  # without the tool, a call is answered with an error and counted
  (e2,) = ep_lib.run_episodes(Scripted(tok, turns), ep_lib.Renderer(tok),
                              [PythonToolEnv(None, with_tool=False)], [task],
                              sampling=SamplingParams(max_new_tokens=64), caps=ep_lib.EpisodeCaps())
  assert "no tools are available" in e2.turns[0].records[0].output
  assert e2.reward.violations == ("tool_call",)
