"""Advantage estimators against values worked out by hand on small arrays."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpt.algorithms import advantages as A


def test_outcome_token_rewards_sits_on_last_valid_token():
  mask = jnp.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]], bool)
  out = A.outcome_token_rewards(jnp.array([2.0, 3.0, 5.0]), mask)
  np.testing.assert_array_equal(out, [[0, 2, 0], [0, 0, 3], [0, 0, 0]])


def _outcome(rewards, t=3):
  mask = jnp.ones((len(rewards), t), bool)
  return A.outcome_token_rewards(jnp.array(rewards, jnp.float32), mask), mask


def test_group_norm_uses_sample_std_and_zeroes_flat_groups():
  r, mask = _outcome([1, 0, 0, 1, 1, 1, 1, 1])
  adv = A.group_norm(r, mask, group_size=4, eps=1e-6)
  # group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3): A = +-0.5*sqrt(3)
  a = 0.5 / (1 / math.sqrt(3) + 1e-6)
  np.testing.assert_allclose(adv[:, 0], [a, -a, -a, a, 0, 0, 0, 0], rtol=1e-6)
  # one advantage per row, broadcast over its tokens
  np.testing.assert_allclose(adv, np.repeat(np.asarray(adv[:, :1]), 3, axis=1))


def test_group_norm_masks_tokens_and_sums_token_rewards():
  mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
  tok = jnp.array([[0.5, 0.5, 9.0], [0.0, 0.0, 0.0]])  # 9.0 is masked: R = [1, 0]
  adv = A.group_norm(tok, mask, group_size=2, eps=0.0)
  s = 1 / math.sqrt(2)  # sample std of {1, 0}
  np.testing.assert_allclose(adv, [[0.5 / s, 0.5 / s, 0], [-0.5 / s] * 3], rtol=1e-6)


def test_group_mean_is_dr_grpo_without_std():
  r, mask = _outcome([1, 0, 0, 1, 3, 1, 1, 1])
  adv = A.group_mean(r, mask, group_size=4)
  np.testing.assert_allclose(adv[:, 1], [0.5, -0.5, -0.5, 0.5, 1.5, -0.5, -0.5, -0.5])


def test_rloo_leave_one_out_baseline():
  r, mask = _outcome([1, 0, 0, 0, 2, 4, 0, 6])
  adv = A.rloo(r, mask, group_size=4)
  # row 0: 1 - 0/3; row 1: 0 - 1/3; row 4: 2 - (4+0+6)/3; row 7: 6 - (2+4+0)/3
  np.testing.assert_allclose(
      adv[:, 2], [1, -1 / 3, -1 / 3, -1 / 3, 2 - 10 / 3, 4 - 8 / 3, 0 - 12 / 3, 6 - 2],
      rtol=1e-6)


def test_discounted_returns_skip_masked_tokens():
  tok = jnp.array([[1.0, 7.0, 2.0]])
  mask = jnp.array([[1, 0, 1]], bool)
  # G2 = 2; token 1 is masked (not a step): G0 = 1 + 0.5 * 2 = 2
  np.testing.assert_allclose(A.discounted_returns(tok, mask, gamma=0.5), [[2, 0, 2]])


def test_reinforce_pp_normalizes_over_every_valid_token():
  mask = jnp.array([[1, 1, 1], [0, 1, 1]], bool)
  tok = jnp.array([[0.0, 0.0, 1.0], [5.0, 0.0, -1.0]])  # 5.0 sits on a prompt token
  adv = A.reinforce_pp(tok, mask, group_size=1, gamma=1.0, eps=0.0)
  # returns on valid tokens: 1, 1, 1, -1, -1 -> mean 0.2, population var 0.96
  sd = math.sqrt(0.96)
  np.testing.assert_allclose(adv, [[0.8 / sd] * 3, [0, -1.2 / sd, -1.2 / sd]], rtol=1e-6)


def test_gae_by_hand_and_ignores_padding():
  tok = jnp.array([[0.0, 0.0, 1.0, 5.0]])
  values = jnp.array([[0.5, 0.6, 0.7, 9.0]])
  mask = jnp.array([[1, 1, 1, 0]], bool)
  adv = A.gae(tok, mask, group_size=1, values=values, gamma=1.0, lam=0.5)
  # d2 = 1 - .7 = .3; d1 = .7 - .6 = .1 -> A1 = .1 + .5*.3; d0 = .6 - .5 -> A0 = .1 + .5*A1
  np.testing.assert_allclose(adv, [[0.225, 0.25, 0.3, 0.0]], atol=1e-6)
  adv = A.gae(tok, mask, group_size=1, values=values, gamma=0.9, lam=1.0)
  d = [0.9 * 0.6 - 0.5, 0.9 * 0.7 - 0.6, 1 - 0.7]
  a2 = d[2]; a1 = d[1] + 0.9 * a2; a0 = d[0] + 0.9 * a1
  np.testing.assert_allclose(adv, [[a0, a1, a2, 0.0]], atol=1e-6)


def test_gae_with_lambda_one_gamma_one_is_return_minus_value():
  rng = np.random.default_rng(0)
  tok = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)
  values = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)
  mask = jnp.ones((2, 5), bool)
  adv = A.gae(tok, mask, group_size=1, values=values, gamma=1.0, lam=1.0)
  ret = np.cumsum(np.asarray(tok)[:, ::-1], axis=1)[:, ::-1]
  np.testing.assert_allclose(adv, ret - np.asarray(values), atol=1e-5)


def test_registry_and_jit():
  r, mask = _outcome([1, 0, 0, 1])
  fn = jax.jit(lambda t, m: A.compute_advantages("group_mean", t, m, group_size=2))
  np.testing.assert_allclose(fn(r, mask)[:, 0], [0.5, -0.5, -0.5, 0.5])
  with pytest.raises(ValueError, match="unknown advantage.*'grpo_norm'.*did you mean 'group_norm'"):
    A.ADVANTAGES.get("grpo_norm")
  with pytest.raises(ValueError, match="needs values"):
    A.gae(r, mask, group_size=1)


def test_group_layout_errors():
  r, mask = _outcome([1, 0, 0])
  with pytest.raises(ValueError, match="not a whole number of groups of 2"):
    A.group_norm(r, mask, group_size=2)
  with pytest.raises(ValueError, match="group_size >= 2"):
    A.rloo(r, mask, group_size=1)
