"""DAPO's dynamic sampling filter/refill and overlong shaping."""

import numpy as np
import pytest

from rlpt.algorithms import dapo


def test_nonzero_variance_groups():
  keep = dapo.nonzero_variance_groups([1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1], 4)
  np.testing.assert_array_equal(keep, [True, False, False])
  with pytest.raises(ValueError, match="whole number of groups of 4"):
    dapo.nonzero_variance_groups([1, 0, 1], 4)


def test_dynamic_sampler_filters_and_refills():
  s = dapo.DynamicSampler(target_groups=3, group_size=2)
  assert s.add([1, 0, 1, 1, 0, 0], ["a", "b", "c"]) == 1
  assert not s.full and s.dropped == 2
  with pytest.raises(RuntimeError, match="holds 1 of 3"):
    s.take()
  s.add([0, 1, 1, 1, 0.5, 0], ["d", "e", "f"])
  assert s.add([1, 0], ["g"]) == 1  # surplus is kept for the next batch
  rewards, groups = s.take()
  assert groups == ["a", "d", "f"]
  np.testing.assert_array_equal(rewards, [1, 0, 0, 1, 0.5, 0])
  assert s.held == 1
  r, g = s.take(allow_partial=True)
  assert g == ["g"] and list(r) == [1, 0]


def test_overlong_penalty():
  got = dapo.overlong_penalty(np.array([10, 16, 18, 20, 21]), max_len=20, buffer=4)
  # linear ramp from 0 at 16 to -1 at 20: (16 - 18) / 4 = -0.5
  np.testing.assert_allclose(got, [0, 0, -0.5, -1, -1])
  np.testing.assert_allclose(dapo.overlong_penalty([30], max_len=20, buffer=0), [0])
  with pytest.raises(ValueError, match="exceeds max_len"):
    dapo.overlong_penalty([1], max_len=4, buffer=8)
