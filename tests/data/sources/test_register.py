"""A new domain's task source, registered at run time, is found like a built-in one."""

import pytest

from rlpt.data import sources
from rlpt.types import Task


class _Evens:
  def __init__(self, seed=0):
    self.seed = seed

  def train(self, index):
    return Task("test/evens", f"{2 * index + self.seed}=", str(2 * index + self.seed))

  def holdout(self, n):
    return [Task("test/evens", f"{-2 * i}=", str(-2 * i)) for i in range(1, n + 1)]


def test_a_registered_source_is_built_by_domain_and_seed():
  sources.register("test/evens", _Evens)
  try:
    assert "test/evens" in sources.domains()
    src = sources.get_source("test/evens", seed=1)
    assert src.train(3).answer == "7" and len(src.holdout(2)) == 2
    with pytest.raises(KeyError, match="'test/evens' already has a task source"):
      sources.register("test/evens", _Evens, replace=False)
    with pytest.raises(TypeError, match="factory must be callable"):
      sources.register("test/odds", 3)
  finally:
    sources._REGISTERED.pop("test/evens", None)
  with pytest.raises(KeyError, match="no task source for domain 'test/evens'"):
    sources.get_source("test/evens")
