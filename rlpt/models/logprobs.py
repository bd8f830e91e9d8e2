"""Per-token log-probabilities: the one function the learner and the rollout engine share.

`chunked_logprobs` is the one vocabulary projection of every scorer: the learner (its
packed layout, with entropy), `token_logprobs` (rollout servers' prompt scoring, tests)
and launch.plan's long-context step (strided chunks over a sequence-sharded axis).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlpt.models.decoder import Decoder, forward, output_logits


def _add_pairs(a, b):
  return a[0] + b[0], a[1] + b[1]


@jax.custom_vjp
def logz_and_entropy(logits):
  """(log Z, entropy) of softmax(logits) over the last axis; float32[...] each.

  logz = log sum_v exp(z_v); entropy = logz - sum_v p_v z_v. Both sums come from one
  two-output reduction over exp(z - max z), so each logit is exponentiated once (as
  `jax.nn.logsumexp` followed by a separate entropy pass did twice, and XLA:CPU ran
  the second exp inside a reduction ~50x slower than an elementwise one: 690 ms vs
  13 ms for [4, 192, 49152]). The backward pass is one elementwise expression:
  d logz / dz = p, d entropy / dz = p * (logz - entropy - z).
  """
  return _logz_and_entropy(logits)


_SUM_BLOCK = 256


def _logz_and_entropy(logits):
  z = logits.astype(jnp.float32)
  m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
  d = z - m                          # <= 0: entropy = log s - sum(e d) / s, no cancellation
  pad = (-d.shape[-1]) % _SUM_BLOCK
  if pad:
    d = jnp.pad(d, [(0, 0)] * (d.ndim - 1) + [(0, pad)], constant_values=-jnp.inf)
  d = d.reshape(*d.shape[:-1], -1, _SUM_BLOCK)
  e = jnp.exp(d)
  ed = jnp.where(e > 0, e * d, 0.0)  # a -inf logit (a masked token) adds nothing
  # Sums of 256 terms, then of the block sums: XLA:CPU adds a two-output reduction's
  # terms one after another, and one running float32 sum over 49152 terms was 2.6e-4
  # off in log Z (blocked: ~1e-6, as jax.nn.logsumexp).
  s, t = jax.lax.reduce((e, ed), (jnp.float32(0), jnp.float32(0)), _add_pairs, (d.ndim - 1,))
  s, t = jnp.sum(s, axis=-1), jnp.sum(t, axis=-1)
  log_s = jnp.log(s)
  return m[..., 0] + log_s, log_s - t / s


def _lze_fwd(logits):
  logz, ent = _logz_and_entropy(logits)
  return (logz, ent), (logits, logz, ent)


def _lze_bwd(res, g):
  logits, logz, ent = res
  g_logz, g_ent = g
  z = logits.astype(jnp.float32)
  p = jnp.exp(z - logz[..., None])
  shift = jnp.where(p > 0, (logz - ent)[..., None] - z, 0.0)
  grad = p * (g_logz[..., None] + g_ent[..., None] * shift)
  return (grad.astype(logits.dtype),)


logz_and_entropy.defvjp(_lze_fwd, _lze_bwd)


def token_logprobs(model: Decoder, tokens, loss_mask, *, attention_mask=None, positions=None,
                   temperature: float = 1.0, chunk_size: int = 512):
  """log p(tokens[b, t] | tokens[b, :t]) for every scored position; float32[B, T].

  Which positions are scored: out[b, t] for 1 <= t < T is the log-probability the
  model assigns to token tokens[b, t] given the tokens before it, i.e. read from the
  logits at position t-1; it is kept where loss_mask[b, t] is true and is 0.0
  elsewhere. out[b, 0] is always 0 (nothing predicts the first token). So the
  output is aligned with `tokens`: a completion's logprobs are
  out[b, prompt_len:prompt_len + completion_len] with loss_mask true there.

  Args:
    model: a `Decoder`.
    tokens: int32[B, T].
    loss_mask: bool/int[B, T]; which tokens to score.
    attention_mask: bool/int[B, T], 0 for padding (left or right); default all 1.
    positions: int32[B, T] RoPE positions; default counts real tokens (see Decoder).
    temperature: logits are divided by it before the softmax (1.0 = the policy).
    chunk_size: the vocabulary projection and log-softmax run over this many
      positions at a time (rematerialised in the backward pass), so the [B, T, V]
      logits never exist in memory at once.
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  B, T = tokens.shape
  cfg = model.config
  params = model.arrays()
  mask = jnp.ones((B, T), bool) if attention_mask is None else jnp.asarray(attention_mask, bool)
  if positions is None:
    positions = jnp.maximum(jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)
  h = forward(cfg, params, tokens[:, :-1], positions=jnp.asarray(positions)[:, :-1],
              attention_mask=mask[:, :-1], return_hidden=True)  # [B, T-1, D]
  lp, _ = chunked_logprobs(cfg, params, h, tokens[:, 1:], chunk_size=chunk_size,
                           temperature=temperature, remat=True)
  lp = jnp.concatenate([jnp.zeros((B, 1), jnp.float32), lp], axis=1)
  return jnp.where(jnp.asarray(loss_mask, bool), lp, 0.0)


def chunked_logprobs(cfg, params, h_BxNxD, targets_BxN, *, chunk_size: int = 256,
                     with_entropy: bool = False, temperature: float = 1.0, strided: bool = False,
                     remat: bool | None = None):
  """(logprobs, entropy), float32[B, N] each: log p(targets[b, j]) and the entropy of the
  next-token distribution read from hidden state h[b, j] (entropy is zeros unless
  `with_entropy`; it then has a closed-form backward, `logz_and_entropy`).

  The vocabulary projection runs `chunk_size` positions at a time, so the [B, N, V]
  logits never exist at once; each chunk is rematerialised in the backward pass when
  `remat` (default: when there are several chunks; one chunk keeps its logits, there is
  no memory to win). Chunks are contiguous ([j*c, (j+1)*c), N padded to a multiple), or
  with `strided` chunk j holds positions j, j + N/c, j + 2N/c, ... (N must be a
  multiple of c): with N sharded over a sequence axis, every device then projects only
  its own positions and nothing is gathered. Logits are divided by `temperature`.
  """
  B, n = targets_BxN.shape
  if strided:
    c = chunk_size
    if n % c:
      raise ValueError(f"chunked_logprobs(strided=True): chunk_size={c} must divide {n} positions")
    nc, pad = n // c, 0
    h_c = jnp.moveaxis(h_BxNxD.reshape(B, c, nc, -1), 2, 0)          # [nc, B, c, D]
    t_c = jnp.moveaxis(targets_BxN.reshape(B, c, nc), 2, 0)
  else:
    c = max(1, min(chunk_size, n))
    pad = (-n) % c
    nc = (n + pad) // c
    h = jnp.pad(h_BxNxD, ((0, 0), (0, pad), (0, 0)))
    t = jnp.pad(targets_BxN, ((0, 0), (0, pad)))
    h_c = h.reshape(B, nc, c, -1).swapaxes(0, 1)                     # [nc, B, c, D]
    t_c = t.reshape(B, nc, c).swapaxes(0, 1)

  def chunk(args):
    hc, tc = args
    logits = output_logits(cfg, params, hc)
    if temperature != 1.0:
      logits = logits / temperature
    picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
    if not with_entropy:
      return picked - jax.nn.logsumexp(logits, axis=-1), jnp.zeros_like(picked)
    logz, ent = logz_and_entropy(logits)
    return picked - logz, ent

  remat = nc > 1 if remat is None else remat
  lp, ent = jax.lax.map(jax.checkpoint(chunk) if remat else chunk, (h_c, t_c))
  if strided:
    fix = lambda x: jnp.moveaxis(x, 0, 2).reshape(B, n)  # noqa: E731
  else:
    fix = lambda x: x.swapaxes(0, 1).reshape(B, n + pad)[:, :n]  # noqa: E731
  return fix(lp), fix(ent)
