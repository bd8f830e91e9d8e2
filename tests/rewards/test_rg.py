"""The reasoning-gym adapter: exact scoring where reasoning-gym's partial credit
can be farmed, hedging rejected, graded scores only when asked for."""

import pytest

from rlpt import rewards
from rlpt.data import sources
from rlpt.rewards import rg
from rlpt.types import Task


def _task(domain, i=0):
  return sources.get_source(domain, seed=3).train(i)


def test_every_generator_is_registered():
  assert len(rg.generators()) >= 100
  for name in rg.generators():
    v = rewards.VERIFIER_REGISTRY[f"rg/{name}"]
    assert isinstance(v, rg.RGVerifier) and v.generator == name and not v.partial_credit


def test_substring_credit_is_gamed_raw_but_not_by_the_adapter():
  t = _task("rg/gcd")
  gold = t.metadata["rg_entry"]["answer"]
  # list every number up to 60 around the gold: the base scorer pays len(gold)/len(answer)
  spray = " ".join(str(i) for i in range(60)) + " " + gold
  assert 0.0 < rg.raw_score("gcd", spray, t.metadata["rg_entry"]) < 1.0
  assert "gcd" in rg.base_scorer_generators()
  rs = rewards.compute_rewards([t, t], [f"<answer>{spray}</answer>", f"<answer>{gold}</answer>"])
  assert [r.score for r in rs] == [0.0, 1.0]


@pytest.mark.parametrize("domain,junk", [
    ("rg/jugs", '["fill A"]'),                 # 0.01 for any parsable JSON
    ("rg/word_sorting", "zebra, apple"),       # >= 0.2 floor for a word list
    ("rg/fraction_simplification", "$1/2$"),   # credit for any fraction
])
def test_format_credit_is_zero(domain, junk):
  t = _task(domain)
  raw = rg.raw_score(domain[3:], junk, t.metadata["rg_entry"])
  r = rewards.compute_reward(t, f"<answer>{junk}</answer>")
  if raw < 1.0:
    assert r.score == 0.0
  assert domain[3:] in rg.GAMEABLE_PARTIAL_CREDIT


def test_partial_credit_can_be_enabled():
  rewards.register("test/rg_gcd_partial", rg.RGVerifier("gcd", partial_credit=True))
  try:
    t = _task("rg/gcd")
    t = Task("test/rg_gcd_partial", t.prompt, t.answer, t.metadata)
    gold = t.metadata["rg_entry"]["answer"]
    r = rewards.compute_reward(t, f"<answer>0 {gold}</answer>")
    assert 0.0 < r.score < 1.0
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/rg_gcd_partial")


def test_hedging_and_missing_tag():
  t = _task("rg/chain_sum")
  gold = t.metadata["rg_entry"]["answer"]
  rs = rewards.compute_rewards([t] * 3, [
      f"<answer>{int(gold) + 1}</answer><answer>{gold}</answer>", gold,
      f"think... <answer> {gold} </answer>"])
  assert rs[0].score == 0.0 and rs[0].violations == ("format",)
  assert rs[1].score == 0.0 and rs[1].violations == ("format",)
  assert rs[2].score == 1.0 and rs[2].violations == ()


def test_missing_entry_is_an_error():
  r = rewards.compute_reward(Task("rg/gcd", "p", "1"), "<answer>1</answer>")
  assert r.violations == ("error",) and "rg_entry" in r.details["error"]


def test_scorer_that_raises_on_garbage_scores_zero_not_error():
  t = _task("rg/prime_factorization")
  r = rewards.compute_reward(t, "<answer>I am not sure</answer>")
  assert r.score == 0.0 and r.violations == () and "ValueError" in r.details["scorer_error"]


def test_strict_scorers_close_what_the_audit_found():
  """launch.audit_rewards found two reasoning-gym scorers that pay for nothing:
  game_of_life_halting took bool() of two non-empty strings (any answer scored 1), and
  rush_hour skipped illegal moves (garbage around a solution scored 1)."""
  import reasoning_gym
  from rlpt.data.sources.rg_tasks import reference_answer
  ds = reasoning_gym.create_dataset("game_of_life_halting", size=8, seed=3)
  for e in ds:
    gold = str(e["answer"])
    wrong = "False" if gold == "True" else "True"
    assert rg.raw_score("game_of_life_halting", gold, e) == 1.0
    assert rg.raw_score("game_of_life_halting", wrong, e) == 0.0
    assert rg.raw_score("game_of_life_halting", "True, False", e) == 0.0
    assert ds.score_answer(wrong, e) == 1.0  # the upstream scorer's flaw, still there
  ds = reasoning_gym.create_dataset("rush_hour", size=4, seed=3)
  for e in ds:
    gold = reference_answer(e)
    assert rg.raw_score("rush_hour", gold, e) == 1.0
    assert rg.raw_score("rush_hour", "Z+9 " + gold, e) == 0.0      # an illegal move first
    assert rg.raw_score("rush_hour", gold + " plus some words", e) == 0.0
    assert ds.score_answer("Z+9 " + gold, e) == 1.0  # upstream pays for it


def test_strict_formats_refuse_hedged_lists():
  """propositional_logic's parser took a list of formulas as one, sokoban skipped the
  separators between several move strings: both now need one answer."""
  import reasoning_gym
  from rlpt.data.sources.rg_tasks import reference_answer
  for name, join in (("propositional_logic", ", "), ("sokoban", ", ")):
    ds = reasoning_gym.create_dataset(name, size=6, seed=5)
    es = list(ds)
    for e in es:
      gold = reference_answer(e)
      others = [reference_answer(x) for x in es if x is not e][:2]
      assert rg.raw_score(name, gold, e) == 1.0, (name, gold)
      assert rg.raw_score(name, join.join(others[:1] + [gold] + others[1:]), e) == 0.0


def test_puzzle24_needs_the_tasks_numbers():
  """The audit's constant column showed "1*2*2*6" right on 100 % of puzzle24's holdout:
  reasoning-gym never checked that the numbers were the task's."""
  import reasoning_gym
  from rlpt.data.sources.rg_tasks import reference_answer
  ds = reasoning_gym.create_dataset("puzzle24", size=6, seed=2)
  for e in ds:
    gold = reference_answer(e)
    assert rg.raw_score("puzzle24", gold, e) == 1.0
    if sorted(e["metadata"]["numbers"]) != [1, 2, 2, 6]:
      assert rg.raw_score("puzzle24", "1*2*2*6", e) == 0.0
      assert ds.score_answer("1*2*2*6", e) == 1.0  # upstream pays for it
