"""Behaviour importance weights and their caps, against values computed by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rlpt.algorithms import AlgoSpec
from rlpt.algorithms import off_policy


def _case():
  # two rows of three tokens; the last token of row 1 is padding
  prox = np.log(np.array([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]], np.float32))
  behav = np.log(np.array([[0.25, 0.4, 0.3], [0.3, 0.1, 0.5]], np.float32))
  mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
  return prox, behav, mask


def test_importance_weights_are_prox_over_behaviour_on_the_mask():
  prox, behav, mask = _case()
  w = np.asarray(off_policy.importance_weights(prox, behav, mask))
  np.testing.assert_allclose(w, [[2.0, 0.5, 3.0], [1.0, 6.0, 1.0]], rtol=1e-5)


@pytest.mark.parametrize("kind,want", [
    ("none", [[1, 1, 1], [1, 1, 0]]),
    # decoupled PPO: weights past the cap (3.0 and 6.0 > 2.5) leave the loss
    ("decoupled_ppo", [[2.0, 0.5, 0.0], [1.0, 0.0, 0.0]]),
    # truncated IS: weights past the cap are cut to it
    ("tis", [[2.0, 0.5, 2.5], [1.0, 2.5, 0.0]]),
])
def test_applied_weights_per_kind(kind, want):
  prox, behav, mask = _case()
  w = off_policy.importance_weights(prox, behav, mask)
  got = np.asarray(off_policy.applied_weights(kind, w, mask, cap=2.5))
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_weight_stats_describe_the_masked_distribution():
  prox, behav, mask = _case()
  w = off_policy.importance_weights(prox, behav, mask)
  st = {k: float(v) for k, v in off_policy.weight_stats("tis", w, mask, cap=2.5).items()}
  assert st["iw_mean"] == pytest.approx((2 + 0.5 + 3 + 1 + 6) / 5, rel=1e-5)
  assert st["iw_min"] == pytest.approx(0.5, rel=1e-5)
  assert st["iw_max"] == pytest.approx(6.0, rel=1e-5)
  assert st["iw_capped_frac"] == pytest.approx(2 / 5)


def test_unknown_kind_and_bad_cap_are_config_errors():
  prox, behav, mask = _case()
  with pytest.raises(ValueError, match="config.rl.off_policy = 'vtrace'"):
    off_policy.applied_weights("vtrace", jnp.ones((2, 3)), mask, cap=2.0)
  with pytest.raises(ValueError, match="config.rl.off_policy"):
    AlgoSpec(off_policy="vtrace")
  with pytest.raises(ValueError, match="config.rl.importance_cap = 0.5"):
    AlgoSpec(off_policy="tis", importance_cap=0.5)
  assert math.isclose(AlgoSpec().importance_cap, 2.0) and not AlgoSpec().corrects_off_policy
