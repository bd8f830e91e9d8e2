"""Flash-style attention kernels on one chunk of queries against one chunk of keys.

These are the building blocks of `rlpt.ops.attention.blockwise_attention` (one
chunk pair: the whole sequence) and `ring_attention` (one pair per ring step).
Queries are blocked by `bq`, keys by `bk`; only a [bq, bk] score tile per (kv head,
group) exists at a time, so memory is O(T) rather than O(T^2). A tile whose mask is
all False is skipped with `lax.cond` (causal attention computes about half the tiles).

Shapes (G = H // KVH query heads per kv head; lengths already multiples of blocks):
  q      [B, Tq, KVH, G, D]       k, v   [B, Tk, KVH, D]
  q_pos  int32[B, Tq]             kv_pos int32[B, Tk]  (sequence index; causal: kv_pos <= q_pos)
  q_seg  int32[B, Tq]             kv_seg int32[B, Tk]  (attend only within equal ids;
                                   with shared_prefix, keys of segment 0 too: the
                                   prompt a row's packed continuations share)
  kv_ok  bool[B, Tk]                                   (False: key is padding)
  out    float32[B, Tq, KVH, G, D] (normalized)   lse float32[B, Tq, KVH, G]
A query with no visible key gets out = 0 and lse = -inf.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

f32 = jnp.float32


def tile_mask(q_pos, kv_pos, q_seg, kv_seg, kv_ok, causal: bool, shared_prefix: bool = False):
  """bool[B, tq, tk]: which (query, key) pairs may attend: same segment (or, with
  `shared_prefix`, a key of segment 0), a real key, and (causal) not in the future."""
  same = q_seg[:, :, None] == kv_seg[:, None, :]
  if shared_prefix:
    same = same | (kv_seg[:, None, :] == 0)
  m = same & kv_ok[:, None, :]
  if causal:
    m = m & (kv_pos[:, None, :] <= q_pos[:, :, None])
  return m


def _blocks(x, b):
  """[B, T, ...] -> [T//b, B, b, ...] (blocks leading, for scan)."""
  x = x.reshape(x.shape[0], x.shape[1] // b, b, *x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _unblocks(x):
  """[n, B, b, ...] -> [B, n*b, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _scores(qb, kb, scale):
  # qb [B,bq,KVH,G,D], kb [B,bk,KVH,D] -> [B,KVH,G,bq,bk] in float32
  return jnp.einsum("bqhgd,bkhd->bhgqk", qb, kb, preferred_element_type=f32) * scale


def chunk_fwd(q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, *, causal: bool,
              scale: float, bq: int, bk: int, shared_prefix: bool = False):
  """Attention of the queries `q` over the keys `k`/`v`: (out, lse), see module doc."""
  B, Tq, KVH, G, D = q.shape
  kv_blocks = (_blocks(k, bk), _blocks(v, bk), _blocks(kv_pos, bk), _blocks(kv_seg, bk),
               _blocks(kv_ok, bk))

  def one_q_block(args):
    qb, qpos, qseg = args

    def step(carry, kvb):
      kb, vb, kpos, kseg, kok = kvb
      mask = tile_mask(qpos, kpos, qseg, kseg, kok, causal, shared_prefix)  # [B,bq,bk]

      def compute(carry):
        o, m, l = carry
        s = jnp.where(mask[:, None, None], _scores(qb, kb, scale), -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)
        l = alpha * l + p.sum(-1)
        o = alpha[..., None] * o + jnp.einsum("bhgqk,bkhd->bhgqd", p.astype(vb.dtype), vb,
                                              preferred_element_type=f32)
        return o, m_new, l

      return lax.cond(mask.any(), compute, lambda c: c, carry), None

    init = (jnp.zeros((B, KVH, G, bq, D), f32), jnp.full((B, KVH, G, bq), -jnp.inf, f32),
            jnp.zeros((B, KVH, G, bq), f32))
    (o, m, l), _ = lax.scan(step, init, kv_blocks)
    seen = l > 0
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
    o = jnp.where(seen[..., None], o / jnp.where(seen, l, 1.0)[..., None], 0.0)
    # [B,KVH,G,bq,D] -> [B,bq,KVH,G,D]; lse -> [B,bq,KVH,G]
    return jnp.moveaxis(o, 3, 1), jnp.moveaxis(lse, 3, 1)

  o, lse = lax.map(one_q_block, (_blocks(q, bq), _blocks(q_pos, bq), _blocks(q_seg, bq)))
  return _unblocks(o), _unblocks(lse)


def chunk_bwd(q, k, v, q_pos, kv_pos, q_seg, kv_seg, kv_ok, lse, delta, do, *,
              causal: bool, scale: float, bq: int, bk: int, shared_prefix: bool = False):
  """Gradients (dq, dk, dv), float32, of the attention of `q` over `k`/`v`.

  `lse` [B,Tq,KVH,G] is the log-sum-exp of the scores over ALL keys the queries see
  (for ring attention: over the whole ring), `delta` = sum(do * out, -1) with the
  final output, `do` [B,Tq,KVH,G,D] the output cotangent. Only [bq, bk] tiles exist.
  """
  lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse)
  q_blocks = (_blocks(q, bq), _blocks(do, bq), _blocks(lse_safe, bq), _blocks(delta, bq),
              _blocks(q_pos, bq), _blocks(q_seg, bq))
  nq = q.shape[1] // bq
  B, _, KVH, G, D = q.shape

  def one_kv_block(dq_acc, kvb):
    kb, vb, kpos, kseg, kok = kvb

    def step(carry, qblk):
      qb, dob, lseb, deltab, qpos, qseg = qblk
      mask = tile_mask(qpos, kpos, qseg, kseg, kok, causal, shared_prefix)

      def compute(_):
        s = _scores(qb, kb, scale)
        # [B,bq,KVH,G] -> [B,KVH,G,bq,1]
        lse_t = jnp.moveaxis(lseb, 1, 3)[..., None]
        p = jnp.where(mask[:, None, None], jnp.exp(s - lse_t), 0.0)
        dv = jnp.einsum("bhgqk,bqhgd->bkhd", p, dob, preferred_element_type=f32)
        dp = jnp.einsum("bqhgd,bkhd->bhgqk", dob, vb, preferred_element_type=f32)
        ds = p * (dp - jnp.moveaxis(deltab, 1, 3)[..., None])
        dq = jnp.einsum("bhgqk,bkhd->bqhgd", ds, kb, preferred_element_type=f32) * scale
        dk = jnp.einsum("bhgqk,bqhgd->bkhd", ds, qb, preferred_element_type=f32) * scale
        return dq, dk, dv

      def skip(_):
        return (jnp.zeros((B, bq, KVH, G, D), f32), jnp.zeros((B, bk, KVH, D), f32),
                jnp.zeros((B, bk, KVH, D), f32))

      dq, dk, dv = lax.cond(mask.any(), compute, skip, None)
      return (carry[0] + dk, carry[1] + dv), dq

    zeros = jnp.zeros((B, bk, KVH, D), f32)
    (dk, dv), dq_parts = lax.scan(step, (zeros, zeros), q_blocks)
    return dq_acc + dq_parts, (dk, dv)

  dq0 = jnp.zeros((nq, B, bq, KVH, G, D), f32)
  dq, (dk, dv) = lax.scan(one_kv_block, dq0,
                          (_blocks(k, bk), _blocks(v, bk), _blocks(kv_pos, bk),
                           _blocks(kv_seg, bk), _blocks(kv_ok, bk)))
  return _unblocks(dq), _unblocks(dk), _unblocks(dv)


def merge(o1, lse1, o2, lse2):
  """Combines two normalized partial attentions over disjoint key sets."""
  lse = jnp.logaddexp(lse1, lse2)
  lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse)
  w1 = jnp.where(jnp.isneginf(lse1), 0.0, jnp.exp(lse1 - lse_safe))
  w2 = jnp.where(jnp.isneginf(lse2), 0.0, jnp.exp(lse2 - lse_safe))
  return o1 * w1[..., None] + o2 * w2[..., None], lse


# Shared by the attention entry points (rlpt.ops.attention, rlpt.ops.ring_attention).


def check_qkv(q, k, v, where: str):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"{where}: expected q [B,T,H,D] and k, v [B,S,KVH,D]; got q{q.shape} "
                     f"k{k.shape} v{v.shape}")
  if k.shape != v.shape:
    raise ValueError(f"{where}: k{k.shape} and v{v.shape} must have the same shape")
  if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
    raise ValueError(f"{where}: batch and head_dim of q{q.shape} and k{k.shape} must match")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"{where}: query heads H={q.shape[2]} must be a multiple of kv heads "
                     f"KVH={k.shape[2]} (grouped-query attention)")


def default_masks(B, T, S, q_positions, kv_positions, q_segment_ids, kv_segment_ids, kv_mask):
  iq = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  ik = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
  q_pos = iq if q_positions is None else jnp.broadcast_to(q_positions, (B, T)).astype(jnp.int32)
  kv_pos = ik if kv_positions is None else jnp.broadcast_to(kv_positions,
                                                            (B, S)).astype(jnp.int32)
  q_seg = (jnp.zeros((B, T), jnp.int32) if q_segment_ids is None
           else jnp.broadcast_to(q_segment_ids, (B, T)).astype(jnp.int32))
  kv_seg = (jnp.zeros((B, S), jnp.int32) if kv_segment_ids is None
            else jnp.broadcast_to(kv_segment_ids, (B, S)).astype(jnp.int32))
  kv_ok = (jnp.ones((B, S), bool) if kv_mask is None
           else jnp.broadcast_to(kv_mask, (B, S)).astype(bool))
  return q_pos, kv_pos, q_seg, kv_seg, kv_ok


def pad_to(x, n: int, value=0):
  """Pads axis 1 of x up to length n."""
  if x.shape[1] == n:
    return x
  widths = [(0, 0)] * x.ndim
  widths[1] = (0, n - x.shape[1])
  return jnp.pad(x, widths, constant_values=value)
