r"""The math verifier and its reward-hacking suite: each attempt scores 0 while the
honest answer to the same task scores 1."""

import pytest

from rlpt import rewards
from rlpt.rewards import math_verifier
from rlpt.types import Task

TASK = Task("math", "What is 12 / 4? Put your final answer in \\boxed{}.", answer="3")
FRAC = Task("math", "Simplify 6/8.", answer="$3/4$")


def _scores(task, completions):
  return rewards.compute_rewards([task] * len(completions), completions)


def test_honest_answers_score_one():
  rs = _scores(TASK, [r"12/4 = 3, so \boxed{3}", r"\boxed{3.0}", "<answer>3</answer>",
                      r"\boxed{\frac{6}{2}}", r"I said \boxed{3} and again \boxed{3}"])
  assert [r.score for r in rs] == [1.0] * 5
  assert rewards.compute_reward(FRAC, r"\boxed{\frac{3}{4}}").score == 1.0
  assert rewards.compute_reward(FRAC, r"\boxed{0.75}").score == 1.0


@pytest.mark.parametrize("attack", [
    r"\boxed{1} \boxed{2} \boxed{3} \boxed{4}",          # several boxed answers
    r"\boxed{4} no wait \boxed{3}",                      # hedging: two different answers
    r"\boxed{1, 2, 3, 4}",                               # a list of all options
    r"\boxed{3 \text{ or } 4}",
    r"\boxed{\{1, 2, 3, 4, 5\}}",                        # LaTeX that parses to a set
    r"\boxed{(-\infty, \infty)}",                        # ... or an interval
    r"\boxed{[0, 10]}",
    r"\boxed{\mathbb{R}}",
    r"\boxed{x \in \mathbb{R}}",
    r"\boxed{0 < x < 10}",
    "the answer is 3",                                   # no final answer marker
    r"\boxed{" + "1+" * 2000 + "1}",                     # past max_answer_chars
])
def test_hacks_score_zero(attack):
  r = rewards.compute_reward(TASK, attack)
  assert r.score == 0.0 and r.reward <= 0.0, (attack, r)


def test_hedging_is_a_format_violation_with_configured_penalty():
  cfg = rewards.RewardConfig(penalties={"format": 0.5})
  r = rewards.compute_reward(TASK, r"\boxed{1} \boxed{2} \boxed{3}", config=cfg)
  assert r.violations == ("format",) and r.reward == -0.5


def test_parser_bomb_is_cut_by_the_worker_timeout():
  # sympy tries to evaluate the tower; the worker is killed at the verifier's budget
  v = math_verifier.MathVerifier(timeout_s=2.0)
  rewards.register("test/math_fast_timeout", v)
  try:
    t = Task("test/math_fast_timeout", "p", "3")
    rs = rewards.compute_rewards([t, t, t], [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{3}",
                                             r"\boxed{(x+1)^{100000}}"])
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/math_fast_timeout")
  assert rs[0].violations == ("timeout",) and rs[0].score == 0.0
  assert rs[1].score == 1.0
  assert rs[2].violations == ("timeout",) and rs[2].score == 0.0


def test_gold_missing_is_an_error():
  r = rewards.compute_reward(Task("math", "p", None), r"\boxed{1}")
  assert r.violations == ("error",) and "no gold answer" in r.details["error"]
