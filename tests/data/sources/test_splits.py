"""Hash splits: one key in five is held out, independent of anything but the key."""

from rlpt.data.sources import splits


def test_fraction_and_stability():
  keys = [f"question {i}" for i in range(5000)]
  frac = sum(map(splits.is_holdout, keys)) / len(keys)
  assert 0.17 < frac < 0.23
  assert [splits.split_of(k) for k in keys[:50]] == [splits.split_of(k) for k in keys[:50]]
  assert set(map(splits.split_of, keys)) == set(splits.SPLITS)
