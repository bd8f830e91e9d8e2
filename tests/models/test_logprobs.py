"""token_logprobs: which positions it scores, and that it matches log_softmax of the logits."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlpt.models import Decoder, ModelConfig, token_logprobs
from rlpt.models.logprobs import logz_and_entropy

CFG = ModelConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=False)


def test_token_logprobs_scores_next_token_from_previous_logits():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  B, T = 3, 9
  tokens = rng.integers(0, CFG.vocab_size, size=(B, T)).astype(np.int32)
  attn = np.ones((B, T), bool)
  attn[1, :3] = False  # left padding
  attn[2, 7:] = False  # right padding
  loss = attn.copy()
  loss[:, :4] = False  # score only the "completion" part
  pos = np.maximum(np.cumsum(attn, 1) - 1, 0)

  @nnx.jit
  def both(m):
    logits = m(tokens, positions=pos, attention_mask=attn)
    return logits, token_logprobs(m, tokens, loss, attention_mask=attn, chunk_size=3)

  logits, got = both(model)
  logits, got = np.asarray(logits), np.asarray(got)
  ls = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  want = np.zeros((B, T), np.float32)
  for b in range(B):
    for t in range(1, T):
      if loss[b, t]:
        want[b, t] = ls[b, t - 1, tokens[b, t]]
  assert got.shape == (B, T) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert (got[~loss] == 0).all() and (got[loss] < 0).all()

  # Temperature divides the logits; the chunk size does not change the result.
  hot = nnx.jit(lambda m: token_logprobs(m, tokens, loss, attention_mask=attn,
                                         temperature=2.0, chunk_size=100))(model)
  ls2 = np.asarray(jax.nn.log_softmax(logits / 2.0, axis=-1))
  np.testing.assert_allclose(np.asarray(hot)[0, 5], ls2[0, 4, tokens[0, 5]], atol=1e-5)


def test_token_logprobs_gradient_matches_unchunked():
  model = Decoder(CFG, rngs=nnx.Rngs(1))
  tokens = (np.arange(16, dtype=np.int32).reshape(2, 8) * 7) % CFG.vocab_size
  loss = np.ones((2, 8), bool)

  def ref(m):
    ls = jax.nn.log_softmax(m(tokens), axis=-1)[:, :-1]
    return jnp.sum(jnp.take_along_axis(ls, tokens[:, 1:, None], axis=-1))

  g_ref = nnx.jit(nnx.grad(ref))(model)
  g = nnx.jit(nnx.grad(lambda m: jnp.sum(token_logprobs(m, tokens, loss, chunk_size=3))))(model)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), g, g_ref)


def test_logz_and_entropy_values_and_gradients():
  # Wide logits (std 4) over a 1000-token vocabulary, some -inf (masked tokens).
  z = 4.0 * jax.random.normal(jax.random.key(3), (3, 5, 1000))
  z = z.at[0, 0, :10].set(-jnp.inf)
  logz, ent = logz_and_entropy(z)
  z64 = np.asarray(z, np.float64)
  ref_logz = np.log(np.sum(np.exp(z64), -1))
  p = np.exp(z64 - ref_logz[..., None])
  ref_ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
  np.testing.assert_allclose(logz, ref_logz, rtol=1e-6)
  np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
  # A full-size vocabulary with one dominant token (a confident policy): log Z as
  # close to float64 as jax.nn.logsumexp (one running sum over 49152 terms was 2.6e-4 off).
  big = (3.0 * jax.random.normal(jax.random.key(5), (8, 49152))).at[:, 5].add(25.0)
  b64 = np.asarray(big, np.float64)
  want = np.log(np.exp(b64 - b64.max(-1, keepdims=True)).sum(-1)) + b64.max(-1)
  np.testing.assert_allclose(logz_and_entropy(big)[0], want, atol=1e-5, rtol=0)

  # Gradients of a mix of both outputs against autodiff of the textbook formulas.
  w1, w2 = jax.random.normal(jax.random.key(4), (2, 3, 5))
  zf = jnp.where(jnp.isfinite(z), z, -1e30)

  def ours(z):
    a, b = logz_and_entropy(z)
    return jnp.sum(w1 * a + w2 * b)

  def textbook(z):
    a = jax.nn.logsumexp(z, axis=-1)
    q = jax.nn.softmax(z, axis=-1)
    return jnp.sum(w1 * a + w2 * (a - jnp.sum(q * z, -1)))

  np.testing.assert_allclose(jax.grad(ours)(zf), jax.grad(textbook)(zf), atol=2e-6, rtol=1e-4)


def test_chunked_logprobs_layouts_agree_with_log_softmax_and_gradients():
  """Contiguous chunks (padded), one chunk, and strided chunks (launch.plan's layout)
  give the same logprobs, entropies and gradients as a full log_softmax."""
  from rlpt.models.decoder import output_logits
  from rlpt.models.logprobs import chunked_logprobs
  params = Decoder(CFG, rngs=nnx.Rngs(1)).arrays()
  h = jax.random.normal(jax.random.key(0), (2, 24, CFG.hidden_size))
  t = jax.random.randint(jax.random.key(1), (2, 24), 0, CFG.vocab_size)
  logp = jax.nn.log_softmax(output_logits(CFG, params, h), axis=-1)
  want = np.take_along_axis(np.asarray(logp), np.asarray(t)[..., None], axis=-1)[..., 0]
  want_ent = -(np.exp(logp) * logp).sum(-1)
  grads = []
  for kw in (dict(chunk_size=5), dict(chunk_size=24), dict(chunk_size=6, strided=True)):
    lp, ent = chunked_logprobs(CFG, params, h, t, with_entropy=True, **kw)
    np.testing.assert_allclose(lp, want, atol=2e-5)
    np.testing.assert_allclose(ent, want_ent, atol=2e-5)
    grads.append(jax.grad(lambda hh: chunked_logprobs(CFG, params, hh, t, **kw)[0].sum())(h))
  for g in grads[1:]:
    np.testing.assert_allclose(g, grads[0], atol=1e-5)
  try:
    chunked_logprobs(CFG, params, h, t, chunk_size=7, strided=True)
  except ValueError as e:
    assert "chunk_size=7 must divide 24" in str(e)
  else:
    raise AssertionError("strided chunks that do not divide N must be refused")
