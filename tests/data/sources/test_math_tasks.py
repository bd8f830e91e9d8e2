"""The math task source: interleaved arithmetic / algebra generators, gold strings."""

import pytest

from rlpt.data.sources import math_tasks


def test_tasks_and_splits():
  s = math_tasks.MathSource(seed=0)
  train = [s.train(i) for i in range(27)]
  gens = [t.metadata["generator"] for t in train]
  assert gens[:9] == list(math_tasks.GENERATORS)
  assert all(t.domain == "math" and isinstance(t.answer, str) and "\\boxed{}" in t.prompt
             for t in train)
  assert all("$" not in t.answer for t in train)
  hold = s.holdout(9)
  assert {t.metadata["split"] for t in hold} == {"holdout"}
  assert not {t.prompt for t in train} & {t.prompt for t in hold}
  assert [t.prompt for t in train] == [math_tasks.MathSource(seed=0).train(i).prompt
                                       for i in range(27)]


def test_bad_generator():
  with pytest.raises(ValueError, match="unknown reasoning-gym generators \\['nope'\\]"):
    math_tasks.MathSource(generators=("nope",))
