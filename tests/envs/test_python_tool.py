"""The python_tool domain: its task source, its verifier under reward-hacking
attempts, and its SFT demonstration, which must hold exactly the tokens a real
episode in the sandbox produces."""

from __future__ import annotations

import pathlib
import sys

import pytest

from episode_helpers import Scripted
from rlpt import rewards
from rlpt.data import sources
from rlpt.data.sources import splits, tool_tasks
from rlpt.envs import episode as ep_lib
from rlpt.envs import registry as env_registry
from rlpt.envs import tool_calls
from rlpt.envs.python_tool import PythonToolEnv, demonstration
from rlpt.models.gguf_file import GGUFFile
from rlpt.models.loading import resolve_path
from rlpt.models.tokenizer import Tokenizer
from rlpt.rollout.engine import SamplingParams
from rlpt.train import generation
from rlpt.types import Task

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sandbox"))
import sandbox_helpers  # noqa: E402


@pytest.fixture(scope="module")
def tok():
  path = resolve_path("smollm2-135m-instruct")
  return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=path)


def test_tasks_are_seeded_split_and_their_answers_are_the_expressions_value():
  src = sources.get_source("python_tool", seed=3)
  train = [src.train(i) for i in range(200)]
  assert [t.prompt for t in train[:5]] == [src.train(i).prompt for i in range(5)]
  assert src.train(0).prompt != sources.get_source("python_tool", seed=4).train(0).prompt
  hold = src.holdout(50)
  assert not {t.prompt for t in train} & {t.prompt for t in hold}
  assert all(splits.is_holdout(t.prompt) for t in hold)
  for t in train + hold:
    expr = t.metadata["expression"]
    assert int(t.answer) == eval(expr) and abs(int(t.answer)) >= 1000  # noqa: S307
    assert "*" in expr
  assert len({tuple(f) for f in tool_tasks.FORMS}) == len(tool_tasks.FORMS)
  words = [t for t in train if not t.prompt.startswith("Compute ")]
  assert len(words) > len(train) // 2  # most are phrased in words: the call needs a translation
  assert any("(" in t.metadata["expression"] for t in words)
  w = [src.warmup(i) for i in range(50)]
  assert all(t.prompt == f"Compute {t.metadata['expression']}." for t in w)
  assert not {t.prompt for t in w} & {t.prompt for t in hold}


@pytest.mark.parametrize("completion, score, violations", [
    ("<answer>{a}</answer>", 1.0, ()),
    ("The result is <answer> {a} </answer>.", 1.0, ()),
    ("<answer>{a}</answer> <answer>{a}</answer>", 1.0, ()),        # the same answer twice
    ("<answer>{b}</answer>", 0.0, ()),                             # wrong
    ("{a}", 0.0, ("format",)),                                     # no tag
    ("<answer>{b}</answer><answer>{a}</answer>", 0.0, ("format",)),  # hedging
    ("<answer>{expr}</answer>", 0.0, ("format",)),                 # the expression, not its value
    ("<answer>{a}.0</answer>", 0.0, ("format",)),
    ("<answer>{a_commas}</answer>", 0.0, ("format",)),
    ("\\boxed{{{a}}}", 0.0, ("format",)),                          # another domain's format
])
def test_the_verifier_pays_only_the_exact_integer(completion, score, violations):
  t = sources.get_source("python_tool").train(7)
  a = int(t.answer)
  text = completion.format(a=a, b=a + 1, expr=t.metadata["expression"], a_commas=f"{a:,}")
  r = rewards.compute_reward(t, text)
  assert (r.score, r.violations) == (score, violations), (text, r)


def test_the_domain_is_episodic_and_its_opening_offers_the_tool():
  assert env_registry.is_episodic("python_tool") and not env_registry.is_episodic("math")
  assert "python_tool" in env_registry.domains()
  t = sources.get_source("python_tool").train(0)
  with_tool = generation.opening(t, generation.EpisodeSettings())
  without = generation.opening(t, generation.EpisodeSettings(with_tools=False))
  assert with_tool[-1] == without[-1] == {"role": "user", "content": t.prompt}
  assert "<tool_call>" in with_tool[0]["content"] and "tool" not in without[0]["content"]


@pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")
def test_the_demonstration_is_token_for_token_a_real_sandbox_episode(tok):
  """SFT imitates the episode RL will play: the same prompt, the same tool output
  (run for real), the same masks."""
  src = sources.get_source("python_tool")
  tasks = [src.train(i) for i in range(3)]
  renderer = ep_lib.Renderer(tok)
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    for t in tasks:
      turns = demonstration(t)
      played = [tok.encode(text, add_special_tokens=False) for text, _ in turns]
      (e,) = ep_lib.run_episodes(Scripted(tok, played), renderer, [PythonToolEnv(pool)], [t],
                                 sampling=SamplingParams(max_new_tokens=128),
                                 caps=ep_lib.EpisodeCaps())
      assert e.reward.score == 1.0 and e.reward.violations == (), e.turns
      assert e.turns[0].records[0].exit_code == 0
      prompt, ids, mask = ep_lib.demonstration_ids(
          renderer, generation.opening(t, generation.EpisodeSettings()), turns)
      assert prompt == e.prompt_ids
      assert ids == e.ids and mask == e.mask
      assert sum(mask) == sum(len(p) + 1 for p in played)  # both turns and their stop tokens


def test_a_demonstration_needs_the_expression():
  with pytest.raises(ValueError, match="expression"):
    demonstration(Task("python_tool", "What is 2 * 3?", answer="6"))
