"""KL estimators by hand and their expectations against the exact KL."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rlpt.algorithms import kl


def test_estimators_by_hand():
  lp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
  np.testing.assert_allclose(kl.k1(lp, ref), [[math.log(2)]], rtol=1e-6)
  np.testing.assert_allclose(kl.k2(lp, ref), [[0.5 * math.log(2) ** 2]], rtol=1e-6)
  # log r = log(.25/.5): r - 1 - log r = -0.5 + log 2
  np.testing.assert_allclose(kl.k3(lp, ref), [[-0.5 + math.log(2)]], rtol=1e-6)
  np.testing.assert_allclose(kl.kl_estimate("k3", lp, lp), [[0.0]])


def test_k1_and_k3_are_unbiased_under_the_policy():
  p = np.array([0.5, 0.3, 0.2])
  q = np.array([0.25, 0.25, 0.5])
  exact = float(np.sum(p * np.log(p / q)))
  lp, ref = jnp.log(jnp.asarray(p))[None], jnp.log(jnp.asarray(q))[None]
  for name in ("k1", "k3"):
    np.testing.assert_allclose(float(jnp.sum(jnp.asarray(p) * kl.kl_estimate(name, lp, ref))),
                               exact, rtol=1e-5)
  assert float(jnp.min(kl.k3(lp, ref))) >= 0.0


def test_penalize_rewards():
  out = kl.penalize_rewards(jnp.array([[0.0, 1.0, 3.0]]), jnp.array([[0.5, 0.5, 0.5]]),
                            jnp.array([[1, 1, 0]]), 0.1)
  np.testing.assert_allclose(out, [[-0.05, 0.95, 3.0]], rtol=1e-6)


def test_unknown_estimator():
  with pytest.raises(ValueError, match="unknown KL estimator.*'k4'"):
    kl.kl_estimate("k4", jnp.zeros((1, 1)), jnp.zeros((1, 1)))
