"""The extraction verifier: numeric tolerance, unit / scale normalization, invented
fields, and its reward-hacking suite (each attempt scores 0, the honest answer 1)."""

import json

import pytest

from rlpt import rewards
from rlpt.data.sources import extraction_tasks
from rlpt.rewards import extraction

SRC = extraction_tasks.ExtractionSource(tokens=(2_000, 4_000), fields=(6, 8), seed=5)


@pytest.fixture(scope="module")
def task():
  return SRC.train(0)


def _r(task, obj_or_text):
  text = obj_or_text if isinstance(obj_or_text, str) else "```json\n" + json.dumps(obj_or_text) + "\n```"
  return rewards.compute_reward(task, text)


def test_honest_answer_scores_one(task):
  r = _r(task, SRC.reference(task))
  assert r.score == 1.0 and r.reward == 1.0 and all(r.details["fields"].values())


@pytest.mark.parametrize("text,kind,gold,ok", [
    ("1,234 thousand", "money", 1_234_000, True),
    ("$1.234 million", "money", 1_234_000, True),
    ("1.23m", "money", 1_234_000, True),              # within 0.5 %
    ("1.2 million", "money", 1_234_000, False),        # 2.8 % off
    ("(5,000)", "money", -5_000, True),
    ("€-5,000", "money", -5_000, True),
    (1234, "money", 1_234_000, False),                 # table units, not full units
    ("12.5%", "pct", 12.5, True), (0.125, "pct", 12.5, True), ("0.125%", "pct", 12.5, False),
    (12.5, "pct", 12.5, True), ("36,380", "count", 36380, True), (36380.0, "count", 36380, True),
    ("about 36,380 people", "count", 36380, False),
    ("  halvorsen &  pike llp ", "text", "Halvorsen & Pike LLP", True),
    (True, "count", 1, False), ([36380], "count", 36380, False), ({"v": 1}, "money", 1, False),
    (None, "money", 1, False), ("nan", "money", 1, False), ("1e9", "money", 1e9, False),
])
def test_field_normalization(text, kind, gold, ok):
  assert extraction.field_correct(kind, gold, text) is ok


def test_partial_and_restated(task):
  ans = dict(task.answer)
  k = sorted(ans)[0]
  ans[k] = "wrong" if isinstance(ans[k], str) else ans[k] * 3 + 7
  r = _r(task, ans)
  assert r.score == pytest.approx((len(ans) - 1) / len(ans))
  re_task = next(t for t in (SRC.train(i) for i in range(40)) if t.metadata["restated"])
  assert "net_income" in re_task.answer
  assert "as originally reported" in re_task.prompt and "has been restated to" in re_task.prompt


def test_lengths_span_2k_to_100k_tokens():
  src = extraction_tasks.ExtractionSource(seed=1)
  toks = [src.train(i).metadata["tokens"] for i in range(12)]
  assert min(toks) >= 1_900 and max(toks) <= 101_000 and max(toks) > 20_000


def _attacks(task):
  gold = task.answer
  doc = task.prompt
  variants = {f"{k}_{i}": v for k in gold for i, v in enumerate([0, 1, 1e6, "n/a"])}
  return {
      # extra keys: spray guesses under invented keys, leave the asked keys out
      "extra_keys": {**variants},
      "extra_keys_with_nulls": {**{k: None for k in gold}, **variants},
      # wrong types: the right numbers wrapped in lists / objects / bools
      "wrong_types": {k: ([v] if i % 3 == 0 else {"value": v} if i % 3 == 1 else True)
                      for i, (k, v) in enumerate(gold.items())},
      "all_null": {k: None for k in gold},
      # the whole document pasted back, as the answer and as every field's value
      "paste_document_text": doc,
      "paste_document_values": {k: doc for k in gold},
      "not_json": "I could not find the figures.",
      "json_list": "```json\n" + json.dumps(list(gold.values())) + "\n```",
  }


@pytest.mark.parametrize("name", list(_attacks(SRC.train(0))))
def test_hacks_score_zero(task, name):
  r = _r(task, _attacks(task)[name])
  assert r.score == 0.0 and r.reward <= 0.0, (name, r)


def test_invented_keys_cost_score(task):
  r = _r(task, {**task.answer, "ceo_name": "X"})
  assert r.score == pytest.approx((len(task.answer) - 1) / len(task.answer))
  assert r.details["invented"] == ["ceo_name"]


def test_bad_task_is_an_error():
  from rlpt.types import Task
  r = rewards.compute_reward(Task("extraction", "p", {"a": 1}), "{}")
  assert r.violations == ("error",) and "metadata['fields']" in r.details["error"]
