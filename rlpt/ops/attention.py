"""Softmax attention three ways: reference, blockwise (flash-style) and ring.

All three take q [B, T, H, D] and k, v [B, S, KVH, D] with H a multiple of KVH
(grouped-query attention: query head h reads kv head h // (H // KVH)), scale
1/sqrt(D), and return [B, T, H, D] in q's dtype. Masks: `causal` (key index <=
query index, on `q_positions`/`kv_positions`, default 0..T-1 / 0..S-1), padding
(`kv_mask` bool[B, S], False = not a key) and packing (`q_segment_ids` /
`kv_segment_ids` int[B, T] / [B, S]: attend only within equal ids; with
`shared_prefix=True` keys of segment 0 are seen by every segment, the learner's
packing of a group's continuations after the prompt they share). A query that sees
no key at all returns zeros.

- `reference_attention`: materializes the [T, S] scores; the ground truth.
- `blockwise_attention`: one device, online softmax over [block_q, block_k] tiles,
  O(T) memory, custom VJP whose backward recomputes tiles (no T x S array ever).
- `ring_attention` (its own module, `rlpt.ops.ring_attention`, re-exported here): the
  sequence is sharded over a mesh axis; inside `shard_map` each device keeps its
  queries while K/V blocks travel the ring with `lax.ppermute`; the backward passes
  dK/dV around the ring with them.

The decoder's own dense attention (the learner's and the prefill's) is
`rlpt.ops.dense_attention`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from rlpt.ops import flash
from rlpt.ops.ring_attention import (LAYOUTS, layout_positions, ring_attention,  # noqa: F401
                                     zigzag_order)

def reference_attention(q, k, v, *, causal: bool = True, q_positions=None, kv_positions=None,
                        q_segment_ids=None, kv_segment_ids=None, kv_mask=None,
                        shared_prefix: bool = False):
  """Plain softmax attention (materializes [B, H, T, S] scores). See module doc."""
  flash.check_qkv(q, k, v, "reference_attention")
  B, T, H, D = q.shape
  S, KVH = k.shape[1], k.shape[2]
  q_pos, kv_pos, q_seg, kv_seg, kv_ok = flash.default_masks(B, T, S, q_positions, kv_positions,
                                                  q_segment_ids, kv_segment_ids, kv_mask)
  mask = flash.tile_mask(q_pos, kv_pos, q_seg, kv_seg, kv_ok, causal,
                         shared_prefix)[:, None, None]
  q5 = q.reshape(B, T, KVH, H // KVH, D)
  s = jnp.einsum("bqhgd,bkhd->bhgqk", q5, k, preferred_element_type=jnp.float32)
  s = jnp.where(mask, s / math.sqrt(D), -1e30)
  p = jax.nn.softmax(s, axis=-1) * mask.any(-1, keepdims=True)
  o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(jnp.float32))
  return o.reshape(B, T, H, D).astype(q.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11, 12))
def _flash(q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, causal, scale, bq, bk, shared):
  return flash.chunk_fwd(q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, causal=causal,
                         scale=scale, bq=bq, bk=bk, shared_prefix=shared)[0]


def _flash_fwd(q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, causal, scale, bq, bk, shared):
  q_, q_pos_, kv_pos_, q_seg_, kv_seg_, kv_ok_ = lax.optimization_barrier(
      (q, q_pos, kv_pos, q_seg, kv_seg, kv_ok))  # see the note above _ring
  o, lse = flash.chunk_fwd(q_, k, v, q_pos_, kv_pos_, q_seg_, kv_seg_, kv_ok_, causal=causal,
                           scale=scale, bq=bq, bk=bk, shared_prefix=shared)
  return o, (q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, o, lse)


def _flash_bwd(causal, scale, bq, bk, shared, res, do):
  q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, o, lse = res
  delta = jnp.sum(do * o, axis=-1)
  do, q_pos, kv_pos, q_seg, kv_seg, kv_ok = lax.optimization_barrier(
      (do, q_pos, kv_pos, q_seg, kv_seg, kv_ok))
  dq, dk, dv = flash.chunk_bwd(q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, lse, delta, do,
                               causal=causal, scale=scale, bq=bq, bk=bk,
                               shared_prefix=shared)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
          None, None, None, None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q, k, v, *, causal: bool = True, q_positions=None, kv_positions=None,
                        q_segment_ids=None, kv_segment_ids=None, kv_mask=None,
                        shared_prefix: bool = False, block_q: int = 512, block_k: int = 512):
  """Flash-style attention on one device; same arguments and result as the reference.

  Lengths that are not multiples of the block sizes are padded internally: padded
  keys are masked out and padded queries dropped. Memory is O(T * block) in both
  the forward and the (custom) backward.
  """
  flash.check_qkv(q, k, v, "blockwise_attention")
  B, T, H, D = q.shape
  S, KVH = k.shape[1], k.shape[2]
  bq, bk = min(block_q, T), min(block_k, S)
  if bq < 1 or bk < 1:
    raise ValueError(f"blockwise_attention: block sizes must be >= 1, got {block_q}, {block_k}")
  q_pos, kv_pos, q_seg, kv_seg, kv_ok = flash.default_masks(B, T, S, q_positions, kv_positions,
                                                  q_segment_ids, kv_segment_ids, kv_mask)
  Tp, Sp = -(-T // bq) * bq, -(-S // bk) * bk
  q5 = flash.pad_to(q.reshape(B, T, KVH, H // KVH, D), Tp)
  o = _flash(q5, flash.pad_to(k, Sp), flash.pad_to(v, Sp), flash.pad_to(q_pos, Tp), flash.pad_to(kv_pos, Sp),
             flash.pad_to(q_seg, Tp), flash.pad_to(kv_seg, Sp), flash.pad_to(kv_ok, Sp, False),
             causal, 1.0 / math.sqrt(D), bq, bk, bool(shared_prefix))
  return o[:, :T].reshape(B, T, H, D).astype(q.dtype)
