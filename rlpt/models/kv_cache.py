"""The preallocated key/value cache of incremental decoding, and attention over it.

Layout: k, v are [L, B, K, S, Dh] (layer, row, KV head, slot, head dim), so that for
a row and a KV head the S cached keys are one contiguous [S, Dh] matrix: the
scores of the G = H / K query heads of that KV head against them are a plain
[G, Dh] x [Dh, S] product with no transpose of the cache (the cache is the largest
thing a decode step reads: 2 x L x B x K x S x Dh x 4 bytes, 1.1 GiB for SmolLM2
at B=64, S=384).

One call with T new tokens per row (`attend` inside the layer scan, `write` after
it):
  * the new tokens' queries attend to the cached slots j < index[b] with
    valid[b, j] ("old" part) and to the new tokens u <= t whose mask is set ("new"
    part); the two partial softmaxes are merged exactly (shared max);
  * the old part reads only the first W slots of the cache, W the smallest of
    `windows` that holds every masked row's index + T: early in a decode, when
    rows hold far fewer than S tokens, most of the cache is never read;
  * the new keys/values are written after the layer scan in one scatter into the
    (donated) cache, at slots index[b] .. index[b] + T - 1 (slots >= S dropped).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
  """Preallocated key/value cache for incremental decoding (a pytree).

  Attributes:
    k, v: [L, B, K, S, Dh] keys (after RoPE) and values per layer, row, KV head, slot.
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
  shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)

  def make():
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   valid=jnp.zeros((batch, max_len), bool),
                   index=jnp.zeros((batch,), jnp.int32))

  if sharding is None:
    return make()
  return jax.jit(make, out_shardings=sharding)()


def default_windows(max_len: int, parts: int = 4, multiple: int = 16) -> tuple[int, ...]:
  """Attention windows for a cache of `max_len` slots: `parts` roughly equal steps
  (multiples of `multiple`), the last one `max_len`."""
  out = {max_len}
  for i in range(1, parts):
    w = -(-max_len * i // parts // multiple) * multiple
    if 0 < w < max_len:
      out.add(w)
  return tuple(sorted(out))


def window_index(cache: KVCache, mask_BxT: jax.Array, windows: tuple[int, ...]) -> jax.Array:
  """int32 scalar: which of `windows` the call reads (the smallest holding every
  masked row's index + T; rows with no masked token do not count)."""
  T = mask_BxT.shape[1]
  need = jnp.max(jnp.where(jnp.any(mask_BxT, axis=1), cache.index + T, 0))
  return jnp.sum(jnp.asarray(windows, jnp.int32) < need).astype(jnp.int32)


def attend(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, mask_BxT, cache: KVCache, layer,
           widx, windows: tuple[int, ...], compute_dtype):
  """Attention of T new queries over layer `layer` of the cache plus the new tokens.

  Args:
    q_BxTxHxDh: queries (after RoPE); k, v: the new tokens' keys/values [B, T, K, Dh].
    mask_BxT: bool, the new tokens that are real.
    cache: the cache before this call (not yet holding the new tokens).
    layer: int32 scalar, the layer to read.
    widx: `window_index(...)`; windows: static ascending window sizes (last = S).
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
  q = q.astype(dt)
  old_ok = cache.valid & (jnp.arange(cache.valid.shape[1])[None, :] < cache.index[:, None])

  def old_part(width):
    def run(q):
      kw = jax.lax.dynamic_slice(cache.k, (layer, 0, 0, 0, 0), (1, B, K, width, Dh))[0]
      vw = jax.lax.dynamic_slice(cache.v, (layer, 0, 0, 0, 0), (1, B, K, width, Dh))[0]
      s = jnp.einsum("bkqd,bksd->bkqs", q, kw.astype(dt),
                     preferred_element_type=jnp.float32) * scale
      s = jnp.where(old_ok[:, None, None, :width], s, jnp.float32(-1e30))
      m = jnp.max(s, axis=-1, keepdims=True)
      p = jnp.exp(s - m)
      o = jnp.einsum("bkqs,bksd->bkqd", p.astype(dt), vw.astype(dt),
                     preferred_element_type=jnp.float32)
      return m, jnp.sum(p, axis=-1, keepdims=True), o
    return run

  if len(windows) == 1:
    m_o, z_o, o_o = old_part(windows[0])(q)
  else:
    m_o, z_o, o_o = jax.lax.switch(widx, [old_part(w) for w in windows], q)

  kn = k_BxTxKxDh.transpose(0, 2, 1, 3).astype(dt)  # [B, K, T, Dh]
  vn = v_BxTxKxDh.transpose(0, 2, 1, 3).astype(dt)
  s = jnp.einsum("bkqd,bkud->bkqu", q, kn, preferred_element_type=jnp.float32) * scale
  t_of_q = jnp.arange(T * G) // G
  new_ok = (jnp.arange(T)[None, :] <= t_of_q[:, None])[None] & mask_BxT[:, None, :]  # [B, TG, T]
  s = jnp.where(new_ok[:, None], s, jnp.float32(-1e30))
  m_n = jnp.max(s, axis=-1, keepdims=True)
  p = jnp.exp(s - m_n)
  o_n = jnp.einsum("bkqu,bkud->bkqd", p.astype(dt), vn, preferred_element_type=jnp.float32)
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
  li = jnp.arange(L)[:, None, None, None]
  bi = jnp.arange(B)[None, :, None, None]
  ki = jnp.arange(K)[None, None, :, None]
  si = slots[None, :, None, :]
  put = lambda c, new: c.at[li, bi, ki, si].set(  # noqa: E731
      new.transpose(0, 1, 3, 2, 4).astype(c.dtype), mode="drop")
  valid = cache.valid.at[jnp.arange(B)[:, None], slots].set(mask_BxT, mode="drop")
  return KVCache(k=put(cache.k, new_k_LxBxTxKxDh), v=put(cache.v, new_v_LxBxTxKxDh),
                 valid=valid, index=cache.index + T)
