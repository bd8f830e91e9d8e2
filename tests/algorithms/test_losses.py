"""Policy losses, aggregation modes, entropy and the value loss by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpt.algorithms import losses as L

RATIOS = np.array([0.5, 1.0, 1.5, 1.5, 0.5, 5.0])
ADV = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])


def _inputs():
  lp = jnp.log(jnp.asarray(RATIOS, jnp.float32))[None]
  return lp, jnp.zeros_like(lp), jnp.asarray(ADV, jnp.float32)[None], jnp.ones_like(lp)


def test_ppo_clip_values_clip_mask_and_gradient():
  lp, old, adv, m = _inputs()
  loss, clipped = L.ppo_clip(lp, old, adv, m, eps_low=0.2, eps_high=0.2)
  # max(-A r, -A clip(r, .8, 1.2)) token by token
  np.testing.assert_allclose(loss[0], [-0.5, -1.0, -1.2, 1.5, 0.8, 5.0], rtol=1e-6)
  np.testing.assert_array_equal(clipped[0], [0, 0, 1, 0, 1, 0])
  # d/dlogp: -A r where the unclipped term is active, 0 where clipped
  g = jax.grad(lambda x: L.ppo_clip(x, old, adv, m, eps_low=0.2, eps_high=0.2)[0].sum())(lp)
  np.testing.assert_allclose(g[0], [-0.5, -1.0, 0.0, 1.5, 0.0, 5.0], rtol=1e-6)


def test_clip_higher_uses_separate_bounds():
  lp, old, adv, m = _inputs()
  loss, clipped = L.ppo_clip(lp, old, adv, m, eps_low=0.2, eps_high=0.28)
  np.testing.assert_allclose(loss[0], [-0.5, -1.0, -1.28, 1.5, 0.8, 5.0], rtol=1e-6)
  np.testing.assert_array_equal(clipped[0], [0, 0, 1, 0, 1, 0])


def test_dual_clip_bounds_negative_advantages():
  lp, old, adv, m = _inputs()
  loss, clipped = L.dual_clip(lp, old, adv, m, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
  # last token: r = 5, A = -1: PPO gives 5, the dual clip caps it at -c A = 3
  np.testing.assert_allclose(loss[0], [-0.5, -1.0, -1.2, 1.5, 0.8, 3.0], rtol=1e-6)
  np.testing.assert_array_equal(clipped[0], [0, 0, 1, 0, 1, 1])
  g = jax.grad(lambda x: L.dual_clip(x, old, adv, m, eps_low=0.2, eps_high=0.2)[0].sum())(lp)
  assert float(g[0, 5]) == 0.0
  with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
    L.dual_clip(lp, old, adv, m, dual_clip_c=1.0)


def test_masked_tokens_contribute_nothing():
  lp, old, adv, _ = _inputs()
  m = jnp.array([[1, 0, 1, 0, 1, 0]], jnp.float32)
  loss, clipped = L.ppo_clip(lp, old, adv, m, eps_low=0.2, eps_high=0.2)
  np.testing.assert_allclose(loss[0], [-0.5, 0, -1.2, 0, 0.8, 0], rtol=1e-6)
  np.testing.assert_array_equal(clipped[0], [0, 0, 1, 0, 1, 0])


def test_gspo_sequence_ratio_clip_and_gradient():
  m = jnp.array([[1, 1, 0], [1, 1, 1]], jnp.float32)
  lp = jnp.array([[0.1, 0.3, 9.0], [0.0, 0.0, 0.3]])
  old = jnp.zeros_like(lp)
  adv = jnp.array([[1.0] * 3, [-1.0] * 3])
  loss, clipped = L.gspo(lp, old, adv, m, eps_low=0.2, eps_high=0.2)
  s0, s1 = math.exp(0.2), math.exp(0.1)  # exp(mean log-ratio over valid tokens)
  # row 0: A = 1, s0 = 1.221 > 1.2 -> clipped to -1.2; row 1: A = -1, s1 inside -> s1
  np.testing.assert_allclose(loss, [[-1.2, -1.2, 0], [s1, s1, s1]], rtol=1e-6)
  np.testing.assert_array_equal(clipped, [[1, 1, 0], [0, 0, 0]])
  # gradient of the seq-mean objective = GSPO's: d/dlogp_t [-A s_b] / B = -A s_b / |y_b| / B
  def obj(x):
    tok, _ = L.gspo(x, old, adv, m, eps_low=0.2, eps_high=0.2)
    return L.aggregate("seq_mean_token_mean", tok, m)
  g = jax.grad(obj)(lp)
  np.testing.assert_allclose(g, [[0, 0, 0], [s1 / 3 / 2] * 3], rtol=1e-5)
  # the same gradient, taken through the sequence-level ratio itself
  def seq_obj(x):
    s = jnp.exp(((x - old) * m).sum(1) / m.sum(1))
    return jnp.mean(jnp.where(jnp.arange(2) == 1, s, 0.0))  # row 1 unclipped: -A s = s
  np.testing.assert_allclose(g[1], jax.grad(seq_obj)(lp)[1], rtol=1e-5)


LOSS = jnp.array([[1.0, 2.0, 100.0], [4.0, 100.0, 100.0], [100.0, 100.0, 100.0]])
MASK = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], jnp.float32)


@pytest.mark.parametrize("mode,expected", [
    ("token_mean", (1 + 2 + 4) / 3),
    ("seq_mean_token_mean", ((1 + 2) / 2 + 4 / 1) / 2),   # the empty row does not count
    ("seq_mean_token_sum", ((1 + 2) + 4) / 2),
    ("constant", ((1 + 2) + 4) / 2 / 4),
])
def test_aggregation_modes(mode, expected):
  got = L.aggregate(mode, LOSS, MASK, constant=4)
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  # weights from the full batch make row-wise microbatch sums add up to the full loss
  w = L.loss_weights(mode, MASK, constant=4)
  parts = sum(float(jnp.sum(w[i:i + 1] * LOSS[i:i + 1])) for i in range(3))
  np.testing.assert_allclose(parts, expected, rtol=1e-6)


def test_constant_needs_a_normalizer():
  with pytest.raises(ValueError, match="positive constant"):
    L.loss_weights("constant", MASK)


def test_entropy_and_logprobs_from_logits():
  logits = jnp.array([[[0.0, 0.0], [0.0, math.log(3.0)]]])
  h = L.entropy_from_logits(logits)
  np.testing.assert_allclose(h[0], [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))],
                             rtol=1e-6)
  lp = L.logprobs_from_logits(jnp.array([[[1.0, 2.0, 3.0]]]), jnp.array([[2]]))
  np.testing.assert_allclose(lp, [[3 - math.log(math.e + math.e ** 2 + math.e ** 3)]], rtol=1e-6)


def test_value_loss_clipped():
  v = jnp.array([[1.0, 0.6]])
  v_old = jnp.array([[0.5, 0.5]])
  ret = jnp.array([[2.0, 0.0]])
  out = L.value_loss(v, v_old, ret, jnp.ones((1, 2)), clip=0.2)
  # token 0: V_clip = 0.7: max(1, 1.69)/2; token 1: V_clip = V = 0.6: 0.36/2
  np.testing.assert_allclose(out, [[0.845, 0.18]], rtol=1e-6)
