"""The preallocated key/value cache of incremental decoding, and attention over it.

Layout: k, v are tuples of L per-layer arrays [B, K, S, Dh] (row, KV head, slot,
head dim): for a row and a KV head the S cached keys are one contiguous [S, Dh]
matrix, so the scores of the G = H / K query heads of that KV head against them
are a plain [G, Dh] x [Dh, S] product with no transpose, and each layer's array is
read in place. (One stacked [L, ...] array would have to be sliced by the traced
layer index of the layer scan, and XLA:CPU copies such a slice before the dot can
read it: at B=64 that copy cost more than the attention itself. The scan instead
picks the layer with `lax.switch`, whose branch l reads layer l's own array.) The
cache is the largest thing a decode step reads: 2 x L x B x K x S x Dh x 4 bytes,
1.1 GiB for SmolLM2 at B=64, S=384.

One call with T new tokens per row (`attend` inside the layer scan, `write` after
it):
  * the new tokens' queries attend to the cached slots j < index[b] with
    valid[b, j] ("old" part, all S slots read, invalid ones masked) and to the new
    tokens u <= t whose mask is set ("new" part); the two partial softmaxes are
    merged exactly (shared max);
  * the new keys/values are written after the layer scan, one in-place scatter
    per layer into the (donated) cache, at slots index[b] .. index[b] + T - 1
    (slots >= S dropped).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlpt.ops import decode_attention
from rlpt.ops.dots import dot_operand


class KVCache(NamedTuple):
  """Preallocated key/value cache for incremental decoding (a pytree).

  Attributes:
    k, v: tuples of L arrays [B, K, S, Dh]: keys (after RoPE) and values per layer,
      row, KV head, slot.
    valid: bool[B, S], True where a slot holds a real (non-padding) token.
    index: int32[B], the next slot each row writes to.

  A call with T new tokens writes row b's keys/values to slots index[b] ..
  index[b]+T-1 (slots >= S are dropped: callers keep index + T <= S), sets
  valid[b, slot] from the attention mask, advances index by T; the query in slot s
  attends to the slots j <= s with valid[b, j].
  """

  k: jax.Array
  v: jax.Array
  valid: jax.Array
  index: jax.Array


def init_cache(config, batch: int, max_len: int, dtype=jnp.float32,
               sharding: KVCache | None = None) -> KVCache:
  """An empty cache of `max_len` slots per row: zeros, nothing valid, index 0.

  `sharding`, when given, is a KVCache of `jax.sharding.Sharding`s (see
  `rlpt.models.sharding.cache_shardings`); the arrays are created directly in it.
  """
  shape = (batch, config.num_kv_heads, max_len, config.head_dim)
  L = config.num_layers

  def make():
    return KVCache(k=tuple(jnp.zeros(shape, dtype) for _ in range(L)),
                   v=tuple(jnp.zeros(shape, dtype) for _ in range(L)),
                   valid=jnp.zeros((batch, max_len), bool),
                   index=jnp.zeros((batch,), jnp.int32))

  if sharding is None:
    return make()
  return jax.jit(make, out_shardings=sharding)()


def attend(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, mask_BxT, cache: KVCache, layer,
           compute_dtype, use_kernel: bool = True):
  """Attention of T new queries over layer `layer` of the cache plus the new tokens.

  Args:
    q_BxTxHxDh: queries (after RoPE); k, v: the new tokens' keys/values [B, T, K, Dh].
    mask_BxT: bool, the new tokens that are real.
    cache: the cache before this call (not yet holding the new tokens).
    layer: int32 scalar, the layer to read (traced: the layer scan's counter), or a
      Python int.
    use_kernel: a one-token step (T = 1) reads the cache with
      `rlpt.ops.decode_attention.cache_attention` (on CPU: a kernel that reads each
      row only up to its index); False: XLA ops that read all S slots.
  Returns:
    float32[B, T, H, Dh].
  """
  B, T, H, Dh = q_BxTxHxDh.shape
  K = k_BxTxKxDh.shape[2]
  G = H // K
  dt = compute_dtype
  scale = 1.0 / math.sqrt(Dh)
  # [B, K, T*G, Dh]: query (t, g) of KV head k at row t * G + g.
  q = q_BxTxHxDh.reshape(B, T, K, G, Dh).transpose(0, 2, 1, 3, 4).reshape(B, K, T * G, Dh)
  q = dot_operand(q, dt)
  S = cache.valid.shape[1]
  old_ok = cache.valid & (jnp.arange(S)[None, :] < cache.index[:, None])  # [B, S]

  def old_part(i):
    def run(q, old_ok):
      kc, vc = dot_operand(cache.k[i], dt), dot_operand(cache.v[i], dt)
      if T == 1:
        # One query row per (row, KV head, group): [G, Dh] x [Dh, S] would be B x K tiny
        # GEMMs, which XLA:CPU runs well below memory bandwidth. The CPU kernel (or its
        # XLA reference, a broadcast multiply + reduce that streams the cache) instead.
        m, z, o = decode_attention.cache_attention(
            q, kc, vc, cache.valid, cache.index, scale, use_kernel=use_kernel)
        return m[..., None], z[..., None], o
      s = jnp.einsum("bkqd,bksd->bkqs", q, kc, preferred_element_type=jnp.float32)
      s = jnp.where(old_ok[:, None, None, :], s * scale, jnp.float32(-1e30))
      m = jnp.max(s, axis=-1, keepdims=True)
      p = jnp.exp(s - m)
      o = jnp.einsum("bkqs,bksd->bkqd", dot_operand(p, dt), vc, preferred_element_type=jnp.float32)
      return m, jnp.sum(p, axis=-1, keepdims=True), o
    return run

  L = len(cache.k)
  if isinstance(layer, int):  # a static layer (the caller picked it)
    m_o, z_o, o_o = old_part(layer)(q, old_ok)
  elif L == 1:
    m_o, z_o, o_o = old_part(0)(q, old_ok)
  else:
    m_o, z_o, o_o = jax.lax.switch(layer, [old_part(i) for i in range(L)], q, old_ok)

  kn = dot_operand(k_BxTxKxDh.transpose(0, 2, 1, 3), dt)  # [B, K, T, Dh]
  vn = dot_operand(v_BxTxKxDh.transpose(0, 2, 1, 3), dt)
  s = jnp.einsum("bkqd,bkud->bkqu", q, kn, preferred_element_type=jnp.float32) * scale
  t_of_q = jnp.arange(T * G) // G
  new_ok = (jnp.arange(T)[None, :] <= t_of_q[:, None])[None] & mask_BxT[:, None, :]  # [B, TG, T]
  s = jnp.where(new_ok[:, None], s, jnp.float32(-1e30))
  m_n = jnp.max(s, axis=-1, keepdims=True)
  p = jnp.exp(s - m_n)
  o_n = jnp.einsum("bkqu,bkud->bkqd", dot_operand(p, dt), vn, preferred_element_type=jnp.float32)
  z_n = jnp.sum(p, axis=-1, keepdims=True)

  m = jnp.maximum(m_o, m_n)
  a_o, a_n = jnp.exp(m_o - m), jnp.exp(m_n - m)
  o = (o_o * a_o + o_n * a_n) / (z_o * a_o + z_n * a_n)
  return o.reshape(B, K, T, G, Dh).transpose(0, 2, 1, 3, 4).reshape(B, T, H, Dh)


def write(cache: KVCache, new_k_LxBxTxKxDh, new_v_LxBxTxKxDh, mask_BxT) -> KVCache:
  """The cache after a call: new keys/values at slots index .. index + T - 1 of
  every layer (out of range: dropped), valid from the mask, index advanced by T."""
  L, B, T, K, _ = new_k_LxBxTxKxDh.shape
  slots = cache.index[:, None] + jnp.arange(T, dtype=jnp.int32)[None]  # [B, T]
  bi = jnp.arange(B)[:, None, None]
  ki = jnp.arange(K)[None, :, None]
  si = slots[:, None, :]
  put = lambda c, new: c.at[bi, ki, si].set(  # noqa: E731
      new.transpose(0, 2, 1, 3).astype(c.dtype), mode="drop")
  valid = cache.valid.at[jnp.arange(B)[:, None], slots].set(mask_BxT, mode="drop")
  return KVCache(k=tuple(put(c, new_k_LxBxTxKxDh[i]) for i, c in enumerate(cache.k)),
                 v=tuple(put(c, new_v_LxBxTxKxDh[i]) for i, c in enumerate(cache.v)),
                 valid=valid, index=cache.index + T)
