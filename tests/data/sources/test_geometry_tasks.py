"""Geometry task source: seeded levels, disjoint splits, consistent constraints."""

import math

import pytest

from rlpt.data.sources import geometry_tasks, splits


def test_levels_and_splits():
  s = geometry_tasks.GeometrySource(seed=1)
  train = [s.train(i) for i in range(40)]
  assert {t.metadata["level"] for t in train} == {0, 1, 2, 3}
  assert all(not splits.is_holdout(t.prompt) for t in train)
  assert all(splits.is_holdout(t.prompt) for t in s.holdout(5))
  assert [t.prompt for t in train[:5]] == [geometry_tasks.GeometrySource(seed=1).train(i).prompt
                                           for i in range(5)]
  for t in train:
    c = t.answer
    assert c["volume"] > 0 and c["extents"] == sorted(c["extents"])
    if t.metadata["level"] == 0:  # a box: volume = product of extents
      assert math.isclose(c["volume"], math.prod(c["extents"]), rel_tol=1e-9)
    if t.metadata["level"] == 3:
      assert c["components"] == 2 and c["euler"] == 4


def test_bad_levels():
  with pytest.raises(ValueError, match="levels must be in 0..3"):
    geometry_tasks.GeometrySource(levels=(5,))
