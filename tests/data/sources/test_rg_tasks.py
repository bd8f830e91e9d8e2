"""reasoning-gym task sources: seeded, deterministic, disjoint train / holdout."""

import pytest

from rlpt.data import sources
from rlpt.data.sources import rg_tasks, splits


@pytest.mark.parametrize("gen", ["chain_sum", "letter_counting", "composite"])
def test_deterministic_and_disjoint(gen):
  a, b = rg_tasks.RGSource(gen, seed=1), rg_tasks.RGSource(gen, seed=1)
  train = [a.train(i) for i in range(40)]
  assert [t.prompt for t in train] == [b.train(i).prompt for i in range(40)]
  hold = a.holdout(10)
  assert [t.prompt for t in hold[:4]] == [t.prompt for t in b.holdout(4)]  # prefix-stable
  assert not {t.prompt for t in train} & {t.prompt for t in hold}
  assert all(not splits.is_holdout(t.metadata["rg_entry"]["question"]) for t in train)
  assert all(splits.is_holdout(t.metadata["rg_entry"]["question"]) for t in hold)
  assert all(t.domain == f"rg/{gen}" and t.prompt.endswith(rg_tasks.INSTRUCTION) for t in train)
  other = rg_tasks.RGSource(gen, seed=2)
  assert [t.prompt for t in train[:10]] != [other.train(i).prompt for i in range(10)]


def test_far_index_and_bad_index():
  s = rg_tasks.RGSource("chain_sum")
  assert s.train(10_000).prompt != s.train(0).prompt
  with pytest.raises(IndexError, match="rg/chain_sum: task index must be an int >= 0"):
    s.train(-1)


def test_reference_answers():
  gc = rg_tasks.RGSource("graph_color").train(0)
  assert gc.answer is None and sources.get_source("rg/graph_color").reference(gc).startswith("<answer>{")
  assert rg_tasks.RGSource("boxnet").reference(rg_tasks.RGSource("boxnet").train(0)) is None
  rh = rg_tasks.RGSource("rush_hour").train(0)
  moves = rg_tasks.solve_rush_hour(rh.metadata["rg_entry"]["metadata"]["board_config"])
  from reasoning_gym.games.rush_hour import Board
  b = Board(rh.metadata["rg_entry"]["metadata"]["board_config"])
  assert not b.solved
  b.perform_moves(moves)
  assert b.solved


def test_unknown_domain():
  with pytest.raises(KeyError, match="did you mean"):
    sources.get_source("rg/chain_summ")


def test_generator_config_changes_the_tasks():
  easy = rg_tasks.RGSource("chain_sum", config=(("max_digits", 1), ("max_terms", 2)))
  for t in [easy.train(i) for i in range(20)] + easy.holdout(5):
    meta = t.metadata["rg_entry"]["metadata"]
    assert meta["num_terms"] == 2 and meta["num_digits"] == 1, meta
  assert easy.train(0).prompt != rg_tasks.RGSource("chain_sum").train(0).prompt
  with pytest.raises(ValueError, match=r"rg/chain_sum: reasoning-gym rejects .*max_digitz"):
    rg_tasks.RGSource("chain_sum", config=(("max_digitz", 1),)).train(0)


@pytest.mark.parametrize("gen", ["basic_arithmetic", "chain_sum"])
def test_reference_restates_the_expression_and_scores_one(gen):
  from rlpt import rewards
  src = rg_tasks.RGSource(gen, config=(("max_digits", 1), ("max_terms", 3), ("min_terms", 2)))
  for i in range(5):
    t = src.train(i)
    entry = t.metadata["rg_entry"]
    ref = src.reference(t)
    assert ref == f"{entry['metadata']['expression']} = {entry['answer']}\n<answer>{entry['answer']}</answer>"
    assert rewards.compute_reward(t, ref).score == 1.0
  # entries without an expression keep the bare tagged answer
  lc = rg_tasks.RGSource("letter_counting").train(0)
  assert rg_tasks.RGSource("letter_counting").reference(lc) == f"<answer>{lc.answer}</answer>"
