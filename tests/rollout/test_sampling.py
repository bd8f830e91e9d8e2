"""Sampling matches the exact reference distribution on a small vocabulary.

Each setting draws N = 40_000 tokens (one row per draw, keys from one fixed seed)
from fixed logits over V = 12 tokens and compares the empirical frequencies with
`reference_probs` (float64): total-variation distance < 0.015 (the expected TV of
an exact sampler at this N is about 0.005) and a chi-square goodness-of-fit test
on the support with p-value > 1e-3; tokens outside the support must never appear.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rlpt.rollout import sampling

V = 12
N = 40_000
LOGITS = np.array([2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.0, -0.3, -1.0, -1.5, -2.0, -3.0], np.float32)
PERM = np.random.default_rng(0).permutation(V)  # the largest logit is not token 0
LOGITS = LOGITS[PERM]

_sample = jax.jit(sampling.sample)


def _draw(temperature, top_p, top_k, n=N, seed=0):
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (n, V))
  keys = sampling.sample_row_keys(jnp.full((n,), seed, jnp.uint32), jnp.arange(n, dtype=jnp.int32),
                                  jnp.zeros((n,), jnp.int32))
  full = lambda x, dt: jnp.full((n,), x, dt)
  return _sample(logits, keys, full(temperature, jnp.float32), full(top_p, jnp.float32),
                 full(top_k, jnp.int32))


@pytest.mark.parametrize("temperature,top_p,top_k", [
    (1.0, 1.0, 0), (0.7, 1.0, 0), (1.5, 1.0, 0), (1.0, 1.0, 4), (1.0, 0.8, 0),
    (0.8, 0.9, 6), (1.3, 0.5, 0), (1.0, 1.0, 1)])
def test_matches_reference_distribution(temperature, top_p, top_k):
  tokens, logp, logq = map(np.asarray, _draw(temperature, top_p, top_k))
  ref = sampling.reference_probs(LOGITS, temperature, top_p, top_k)
  counts = np.bincount(tokens, minlength=V)
  freq = counts / N
  tv = 0.5 * np.abs(freq - ref).sum()
  assert tv < 0.015, f"TV {tv:.4f} for T={temperature} p={top_p} k={top_k}"
  support = ref > 0
  assert counts[~support].sum() == 0, "sampled a token the filter removed"
  if support.sum() > 1:
    chi = stats.chisquare(counts[support], ref[support] * N)
    assert chi.pvalue > 1e-3, f"chi-square p={chi.pvalue:.2e}"
  # logq is the log prob under the sampled distribution, logp under T=1.
  np.testing.assert_allclose(logq, np.log(ref[tokens]), atol=2e-5)
  logp_ref = jax.nn.log_softmax(jnp.asarray(LOGITS, jnp.float64 if jax.config.jax_enable_x64
                                            else jnp.float32))
  np.testing.assert_allclose(logp, np.asarray(logp_ref)[tokens], atol=2e-5)


def test_reference_support_sizes():
  # the filters themselves: top-k keeps k tokens, top-p the smallest prefix reaching p
  assert (sampling.reference_probs(LOGITS, 1.0, 1.0, 4) > 0).sum() == 4
  p = sampling.reference_probs(LOGITS, 1.0, 1.0, 0)
  kept = (sampling.reference_probs(LOGITS, 1.0, 0.8, 0) > 0).sum()
  assert np.sort(p)[::-1][:kept - 1].sum() < 0.8 <= np.sort(p)[::-1][:kept].sum()


def test_greedy_is_argmax_with_zero_logq():
  tokens, logp, logq = map(np.asarray, _draw(0.0, 0.5, 3))
  assert (tokens == np.argmax(LOGITS)).all()
  assert (logq == 0).all()
  np.testing.assert_allclose(logp, np.asarray(jax.nn.log_softmax(jnp.asarray(LOGITS)))[tokens],
                             atol=1e-6)


def test_deterministic_per_seed_and_independent_of_batch_mates():
  a = np.asarray(_draw(1.0, 1.0, 0, seed=7)[0])
  b = np.asarray(_draw(1.0, 1.0, 0, seed=7)[0])
  c = np.asarray(_draw(1.0, 1.0, 0, seed=8)[0])
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()
  # Row 0 unfiltered, beside a row that forces the filtered (sorting) branch:
  # its token must be what it draws alone.
  n = N
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (n, V))
  keys = sampling.sample_row_keys(jnp.full((n,), 7, jnp.uint32), jnp.arange(n, dtype=jnp.int32),
                                  jnp.zeros((n,), jnp.int32))
  top_k = jnp.zeros((n,), jnp.int32).at[1].set(3)
  mixed = np.asarray(_sample(logits, keys, jnp.ones((n,)), jnp.ones((n,)), top_k)[0])
  np.testing.assert_array_equal(mixed[2:], a[2:])
  assert mixed[0] == a[0]


def test_large_vocabulary_block_sampling():
  # V = 600 spans three 256-entry blocks of the two-level sampler; the 12 live
  # logits sit in different blocks and everything else is -inf.
  big_v, n = 600, N
  live = np.array([3, 250, 255, 256, 300, 511, 512, 520, 590, 599, 100, 400])
  logits = np.full((big_v,), -np.inf, np.float32)
  logits[live] = LOGITS
  keys = sampling.sample_row_keys(jnp.full((n,), 3, jnp.uint32), jnp.arange(n, dtype=jnp.int32),
                                  jnp.zeros((n,), jnp.int32))
  for temperature, top_p, top_k in [(1.0, 1.0, 0), (0.9, 0.85, 5)]:
    tokens, _, logq = map(np.asarray, _sample(
        jnp.broadcast_to(jnp.asarray(logits), (n, big_v)), keys, jnp.full((n,), temperature),
        jnp.full((n,), top_p), jnp.full((n,), top_k, jnp.int32)))
    ref = sampling.reference_probs(LOGITS, temperature, top_p, top_k)
    counts = np.bincount(tokens, minlength=big_v)
    assert counts.sum() == counts[live].sum(), "drew a -inf token"
    tv = 0.5 * np.abs(counts[live] / n - ref).sum()
    assert tv < 0.015, f"TV {tv:.4f}"
    ref_full = np.zeros(big_v)
    ref_full[live] = ref
    np.testing.assert_allclose(logq, np.log(ref_full[tokens]), atol=2e-5)


def test_fast_argmax_equals_jnp_argmax_on_ties_nan_and_inf():
  rng = np.random.default_rng(5)
  x = rng.standard_normal((6, 300)).astype(np.float32)
  x[1, [7, 250]] = 9.0           # tie: the lower index wins
  x[2, 40] = np.nan              # NaN: its index, as jnp.argmax
  x[2, 10] = 50.0
  x[3] = -np.inf                 # all -inf: index 0
  x[4, [0, 299]] = np.inf        # +inf ties
  x[5, [3, 9]] = np.nan
  want = np.asarray(jnp.argmax(jnp.asarray(x), axis=-1))
  got = np.asarray(jax.jit(sampling._argmax)(jnp.asarray(x)))
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, [np.argmax(x[0]), 7, 40, 0, 0, 3])
