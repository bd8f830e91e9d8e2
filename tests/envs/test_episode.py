"""Token-exact multi-turn episodes: sampled ids are kept, environment ids are
rendered by the chat template and masked, caps truncate, rewrites are detected;
with the real SmolLM2 engine, the learner scores multi-turn rows at gap ~ 0."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from episode_helpers import Echo, Scripted, char_ids
from rlpt.envs import episode as ep_lib
from rlpt.models.gguf_file import GGUFFile
from rlpt.models.loading import resolve_path
from rlpt.models.tokenizer import Tokenizer
from rlpt.rollout.engine import SamplingParams
from rlpt.types import Task


@pytest.fixture(scope="module")
def tok():
  path = resolve_path("smollm2-135m-instruct")
  return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=path)


def _run(tok, turns, env, caps=ep_lib.EpisodeCaps(), renderer=None, task=None):
  engine = Scripted(tok, turns)
  renderer = renderer or ep_lib.Renderer(tok)
  task = task or Task("math", "What is 12 + 30?", answer="42")
  (e,) = ep_lib.run_episodes(engine, renderer, [env], [task],
                             sampling=SamplingParams(max_new_tokens=64), caps=caps)
  return e, engine


def test_decode_then_encode_changes_ids_for_this_tokenizer(tok):
  sampled = char_ids(tok, "hello world 12345")
  text = tok.decode(sampled)
  assert text == "hello world 12345"
  assert tok.encode(text, add_special_tokens=False) != sampled  # the drift


def test_an_episode_keeps_the_sampled_ids_and_masks_the_environment(tok):
  turns = [char_ids(tok, "let me run it"), char_ids(tok, "again"), char_ids(tok, "<answer>42</answer>")]
  e, engine = _run(tok, [list(t) for t in turns], Echo(rounds=2))
  eos = tok.eos_token_id
  spans = [t.span for t in e.turns]
  for (a, b), t in zip(spans, turns):
    assert e.ids[a:b] == t + [eos]  # exactly what was sampled, stop token included
    assert all(e.mask[a:b]) and e.logprobs[a:b] == [-0.5] * (len(t) + 1)
  env_part = e.ids[spans[0][1]:spans[1][0]]
  assert not any(e.mask[spans[0][1]:spans[1][0]]) and e.logprobs[spans[0][1]:spans[1][0]] == [
      0.0] * len(env_part)
  # SmolLM2's template has no tool role: the documented <tool_response> user turn
  assert tok.decode(env_part) == ("\n<|im_start|>user\n<tool_response>\nout 1\n</tool_response>"
                                  "<|im_end|>\n<|im_start|>assistant\n")
  # each turn's prompt is the episode so far, token for token (no re-rendering)
  assert engine.prompts[1] == e.prompt_ids + e.ids[:spans[1][0]]
  # the text equals the re-rendered conversation, but its re-encoding differs
  full = tok.decode(e.prompt_ids + e.ids)
  assert full + "\n" == tok.apply_chat_template(e.messages, add_generation_prompt=False)
  assert tok.encode(full) != e.prompt_ids + e.ids
  assert e.done and e.truncated is None and e.template_rewrites == 0
  assert e.reward.score == 1.0 and e.reward.reward == 1.0
  r = e.to_rollout(group_id=3, tokenizer=tok)
  assert r.completion_ids == e.ids and r.completion_mask == e.mask and r.weight_version == 7
  assert r.finish_reason == "stop" and r.group_id == 3
  assert [t["tools"][0]["output"] for t in r.turns[:2]] == ["out 1", "out 2"]
  assert r.turns[0]["span"] == list(spans[0]) and r.turns[2]["tools"] == []


def test_learner_rows_train_only_the_model_tokens(tok):
  from rlpt.train.batch import pack_rows
  e, _ = _run(tok, [char_ids(tok, "a"), char_ids(tok, "<answer>42</answer>")], Echo(rounds=1))
  rows = pack_rows([e.to_rollout()], np.array([1.0], np.float32), pad_id=0)
  p = len(e.prompt_ids)
  np.testing.assert_array_equal(rows.loss_mask[0, p:p + len(e.ids)], e.mask)
  assert not rows.loss_mask[0, :p].any() and rows.loss_mask[0].sum() == sum(e.mask)
  bad = e.to_rollout()
  bad.completion_mask = bad.completion_mask[:-1]
  with pytest.raises(ValueError, match="completion_mask has"):
    pack_rows([bad], np.array([1.0], np.float32), pad_id=0)


def test_violations_are_priced_and_caps_truncate(tok):
  e, _ = _run(tok, [char_ids(tok, "x")] * 3, Echo(rounds=5, bad_call=True),
              caps=ep_lib.EpisodeCaps(max_turns=3))
  assert e.truncated == "max_turns" and len(e.turns) == 3 and e.reward.reward == 0.0
  assert "tool_call" in e.reward.violations and e.reward.details["truncated"] == "max_turns"
  assert e.to_rollout().finish_reason == "length"
  e, _ = _run(tok, [char_ids(tok, "<answer>42</answer>")] * 3, Echo(rounds=5),
              caps=ep_lib.EpisodeCaps(max_turns=2, truncated_reward="score"))
  assert e.truncated == "max_turns" and e.reward.score == 1.0 and e.reward.reward == 1.0
  e, _ = _run(tok, [char_ids(tok, "y" * 30)] * 4, Echo(rounds=5),
              caps=ep_lib.EpisodeCaps(max_context_tokens=110))
  assert e.truncated == "max_context" and e.reward.reward == 0.0
  with pytest.raises(ValueError, match="truncated_reward"):
    ep_lib.EpisodeCaps(truncated_reward="half")


class Flood(Echo):
  """Answers the first turn with a tool output far longer than the context cap."""

  def step(self, text):
    st = super().step(text)
    return type(st)(messages=({"role": "tool", "name": "python", "content": "9 " * 900},),
                    records=st.records) if st.messages else st


def test_an_answer_past_the_context_cap_ends_the_episode_before_it(tok):
  """Masked environment tokens count against the cap too: a flood of tool output
  must not outgrow the learner's rows (a 2000-token answer in a 448-token episode
  once made a step's packed window 2056 tokens)."""
  caps = ep_lib.EpisodeCaps(max_context_tokens=200)
  e, engine = _run(tok, [char_ids(tok, "call")] * 3, Flood(rounds=5), caps=caps)
  assert e.truncated == "max_context" and len(e.turns) == 1 and e.done
  assert e.context_len <= 200 and len(engine.prompts) == 1
  assert e.turns[0].records and e.turns[0].env_tokens == 0
  assert len(e.ids) == e.turns[0].span[1] and all(e.mask)  # the model's turn, nothing after
  r = e.to_rollout()
  assert len(r.prompt_ids) + len(r.completion_ids) <= 200 and r.finish_reason == "length"
  assert r.turns[-1]["truncated"] == "max_context"


QWEN3_LIKE = (
    "{%- set ns = namespace(last=0) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
    "loop.index0 < ns.last %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}")


def _with_template(tok, template):
  t = copy.copy(tok)
  t.chat_template, t._template = template, None
  return t


def test_a_template_that_rewrites_history_is_detected_and_the_ids_extended(tok):
  """Like Qwen3's: <think> blocks of assistant turns before the last user turn are
  dropped, so once a (fallback, user-role) tool result follows a turn that thought,
  the re-rendered history is no longer a prefix of the episode's ids."""
  t2 = _with_template(tok, QWEN3_LIKE)
  turns = [char_ids(tok, "<think>hmm</think>one"), char_ids(tok, "two"),
           char_ids(tok, "<answer>42</answer>")]
  e, engine = _run(t2, [list(t) for t in turns], Echo(rounds=2), renderer=ep_lib.Renderer(t2))
  # counted once: at the first tool result, which made the template drop turn 1's
  # thought (the second renders the same rewritten history before and after)
  assert e.template_rewrites == 1
  for (a, b), t in zip([x.span for x in e.turns], turns):
    assert e.ids[a:b] == t + [tok.eos_token_id]  # never re-rendered
  assert engine.prompts[2] == e.prompt_ids + e.ids[:e.turns[2].span[0]]
  assert "<think>hmm</think>" in tok.decode(e.ids)  # the sampled thought stays trained
  env_part = e.ids[e.turns[0].span[1]:e.turns[1].span[0]]
  assert tok.decode(env_part) == ("\n<|im_start|>user\n<tool_response>\nout 1\n"
                                  "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_templates_that_cannot_extend_a_conversation_are_refused(tok):
  ep_lib.check_template(tok)
  ep_lib.check_template(_with_template(tok, QWEN3_LIKE))
  with pytest.raises(ValueError, match="cannot render a tool turn"):
    ep_lib.check_template(_with_template(tok, "{{ raise_exception('no tools here') }}"))
  # drops the content of every assistant turn but the last one: even the turn just
  # sampled is rewritten once anything follows it
  harsh = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
           "not loop.last %}[earlier]{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  with pytest.raises(ValueError, match="extension of the conversation"):
    ep_lib.check_template(_with_template(tok, harsh))
  none = _with_template(tok, None)
  with pytest.raises(ValueError, match="need a chat template"):
    ep_lib.check_template(none)
