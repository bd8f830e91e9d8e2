"""Ring attention: softmax attention with the sequence sharded over a mesh axis.

    out = ring_attention(q, k, v, mesh=mesh, axis_name="seq", causal=True)

q [B, T, H, D], k/v [B, T, KVH, D] (grouped-query), the sequence sharded on
`axis_name`; returns [B, T, H, D], equal to plain softmax attention on the gathered
sequence (`rlpt.ops.attention.reference_attention`), with gradients. Inside
`shard_map` each device keeps its queries while K/V blocks travel the ring with
`lax.ppermute` (rlpt.ops.flash computes each block pair); the custom backward passes
dK/dV around the ring with them. Causal attention is load-balanced with the zigzag
layout (device i holds chunks i and 2n-1-i).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P
import numpy as np

from rlpt.ops import flash

LAYOUTS = ("natural", "zigzag", "contiguous")


def zigzag_order(T: int, n: int) -> np.ndarray:
  """Sequence indices in zigzag layout: split 0..T-1 into 2n chunks; device i holds
  chunks i and 2n-1-i, so `x[:, zigzag_order(T, n)]` sharded evenly over n devices
  puts them there. Every device then has the same causal work."""
  if T % (2 * n):
    raise ValueError(f"zigzag layout needs T divisible by 2*n = {2 * n}, got T={T}")
  c = np.arange(T).reshape(2 * n, T // (2 * n))
  return np.concatenate([np.concatenate([c[i], c[2 * n - 1 - i]]) for i in range(n)])


def layout_positions(T: int, n: int, layout: str) -> np.ndarray:
  """int[n, T//n]: the global sequence index of each local slot of each device,
  for layout "zigzag" or "contiguous" (= "natural" order, sharded evenly)."""
  if layout == "zigzag":
    return zigzag_order(T, n).reshape(n, T // n)
  if layout in ("contiguous", "natural"):
    return np.arange(T).reshape(n, T // n)
  raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _local_positions(Tl: int, n: int, layout: str, axis_name: str):
  i = lax.axis_index(axis_name)
  if layout == "zigzag":
    c = Tl // 2
    r = jnp.arange(c, dtype=jnp.int32)
    return jnp.concatenate([i * c + r, (2 * n - 1 - i) * c + r])
  return i * Tl + jnp.arange(Tl, dtype=jnp.int32)


def _zig_dest(c: int, n: int) -> int:
  return c if c < n else 2 * n - 1 - c


def _to_zigzag(x, axis_name: str, n: int):
  """Inside shard_map: natural order (device d: chunks 2d, 2d+1) -> zigzag (device
  i: chunks i, 2n-1-i). Two ppermutes of half the local block each."""
  c = x.shape[1] // 2
  even = lax.ppermute(x[:, :c], axis_name, [(d, _zig_dest(2 * d, n)) for d in range(n)])
  odd = lax.ppermute(x[:, c:], axis_name, [(d, _zig_dest(2 * d + 1, n)) for d in range(n)])
  i_even = lax.axis_index(axis_name) % 2 == 0
  first = jnp.where(i_even, even, odd)
  second = jnp.where(i_even, odd, even)
  return jnp.concatenate([first, second], axis=1)


def _from_zigzag(x, axis_name: str, n: int):
  """Inverse of `_to_zigzag`."""
  c = x.shape[1] // 2
  i_even = lax.axis_index(axis_name) % 2 == 0
  even = jnp.where(i_even, x[:, :c], x[:, c:])
  odd = jnp.where(i_even, x[:, c:], x[:, :c])
  even = lax.ppermute(even, axis_name, [(_zig_dest(2 * d, n), d) for d in range(n)])
  odd = lax.ppermute(odd, axis_name, [(_zig_dest(2 * d + 1, n), d) for d in range(n)])
  return jnp.concatenate([even, odd], axis=1)


def _shift(tree, axis_name: str, n: int):
  perm = [(j, (j + 1) % n) for j in range(n)]
  return jax.tree.map(lambda x: lax.ppermute(x, axis_name, perm), tree)


def _ring_fwd_local(q, k, v, pos, seg, ok, axis_name, n, causal, scale, blk, shared):
  """Per device. Step s: attend to the K/V block that started on device (i - s) mod n
  while the next block is already in flight. Returns (out, lse), float32. (The n-th
  shift, which brings the blocks home unused, keeps the loop uniform: 1/n extra
  traffic in the forward; in the backward it is the one that delivers dK/dV.)"""

  def step(carry, _):
    o, lse, kv = carry
    nxt = _shift(kv, axis_name, n)
    kk, vv, kpos, kseg, kok = kv
    o_s, lse_s = flash.chunk_fwd(q, kk, vv, pos, kpos, seg, kseg, kok, causal=causal,
                                 scale=scale, bq=blk, bk=blk, shared_prefix=shared)
    o, lse = flash.merge(o, lse, o_s, lse_s)
    return (o, lse, nxt), None

  B, T, KVH, G, D = q.shape
  init = (jnp.zeros((B, T, KVH, G, D), jnp.float32),
          jnp.full((B, T, KVH, G), -jnp.inf, jnp.float32), (k, v, pos, seg, ok))
  (o, lse, _), _ = lax.scan(step, init, None, length=n)
  return o, lse


def _ring_bwd_local(q, k, v, pos, seg, ok, o, lse, do, axis_name, n, causal, scale, blk,
                    shared):
  """Per device. dQ stays home; dK/dV accumulators travel with their K/V block and,
  after n shifts, arrive back on the device that owns that block."""
  delta = jnp.sum(do * o, axis=-1)

  def step(carry, _):
    dq, kv, dkv = carry
    kk, vv, kpos, kseg, kok = kv
    dq_s, dk_s, dv_s = flash.chunk_bwd(q, kk, vv, pos, kpos, seg, kseg, kok, lse, delta, do,
                                       causal=causal, scale=scale, bq=blk, bk=blk,
                                       shared_prefix=shared)
    dkv = (dkv[0] + dk_s, dkv[1] + dv_s)
    kv, dkv = _shift((kv, dkv), axis_name, n)
    return (dq + dq_s, kv, dkv), None

  zk = jnp.zeros(k.shape, jnp.float32)
  init = (jnp.zeros(q.shape, jnp.float32), (k, v, pos, seg, ok), (zk, zk))
  (dq, _, (dk, dv)), _ = lax.scan(step, init, None, length=n)
  return dq, dk, dv


def _ring_specs(axis_name, batch, heads):
  """PartitionSpecs of q5 [B,T,KVH,G,D], k/v/lse [B,T,KVH,(D|G)] and masks [B,T]: the
  batch over `batch`, the sequence over the ring axis, kv heads over `heads`."""
  return (P(batch, axis_name, heads, None, None), P(batch, axis_name, heads, None),
          P(batch, axis_name))


def _split_axes(mesh, axis_name: str, head_axis: str | None, B: int, KVH: int):
  """(batch axes, head axis) of the shard_map: `head_axis` on the kv heads where it
  divides them; every other axis of size > 1 on the batch while the product divides B
  (an axis left over is replicated: its devices compute the same attention)."""
  heads = None
  if head_axis in mesh.shape and head_axis != axis_name and mesh.shape[head_axis] > 1 \
      and KVH % mesh.shape[head_axis] == 0:
    heads = head_axis
  batch, size = [], 1
  for ax, n in mesh.shape.items():
    if ax in (axis_name, heads) or n == 1 or B % (size * n):
      continue
    batch.append(ax)
    size *= n
  return (tuple(batch) or None), heads


# Positions, segment ids and the padding mask are the same in every layer. Inside a
# differentiated scan over layers, JAX's partial evaluation would compute everything
# that depends only on them (the mask of every tile of every ring step) once, outside
# the loop, and keep it: O(T^2 / N) memory per device. The optimization_barrier ties
# them to q (forward) or to the cotangent (backward), so tile masks stay inside the
# loops and only ever exist one tile at a time.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _ring(q, k, v, seg, ok, mesh, meta):
  return _ring_fwd(q, k, v, seg, ok, mesh, meta)[0]


def _ring_fwd(q, k, v, seg, ok, mesh, meta):
  axis_name, n, causal, scale, blk, tl, layout, shared, (s5, s4, s2) = meta

  def local(q, k, v, seg, ok):
    pos = _local_positions(tl, n, layout, axis_name)
    pos = flash.pad_to(jnp.broadcast_to(pos, (q.shape[0], tl)), q.shape[1])
    q, pos, seg, ok = lax.optimization_barrier((q, pos, seg, ok))  # see above
    return _ring_fwd_local(q, k, v, pos, seg, ok, axis_name, n, causal, scale, blk, shared)

  o, lse = jax.shard_map(local, mesh=mesh, in_specs=(s5, s4, s4, s2, s2), out_specs=(s5, s4),
                         check_vma=False)(q, k, v, seg, ok)
  return o, (q, k, v, seg, ok, o, lse)


def _ring_bwd(mesh, meta, res, do):
  axis_name, n, causal, scale, blk, tl, layout, shared, (s5, s4, s2) = meta

  def local(q, k, v, seg, ok, o, lse, do):
    pos = _local_positions(tl, n, layout, axis_name)
    pos = flash.pad_to(jnp.broadcast_to(pos, (q.shape[0], tl)), q.shape[1])
    do, pos, seg, ok = lax.optimization_barrier((do, pos, seg, ok))  # see above
    return _ring_bwd_local(q, k, v, pos, seg, ok, o, lse, do, axis_name, n, causal, scale, blk,
                           shared)

  q, k, v, seg, ok, o, lse = res
  dq, dk, dv = jax.shard_map(local, mesh=mesh, in_specs=(s5, s4, s4, s2, s2, s5, s4, s5),
                             out_specs=(s5, s4, s4), check_vma=False)(q, k, v, seg, ok, o, lse, do)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q, k, v, *, mesh, axis_name: str = "seq", causal: bool = True,
                   kv_mask=None, segment_ids=None, shared_prefix: bool = False,
                   layout: str = "natural", block_size: int = 512,
                   head_axis: str | None = "tensor"):
  """Self-attention with the sequence sharded over mesh axis `axis_name` (size n).

  q [B, T, H, D], k/v [B, T, KVH, D]; the result equals `reference_attention` on
  the gathered sequence (same masks), as [B, T, H, D] sharded like q.
  Optional `kv_mask` bool[B, T] (False = padding) and `segment_ids` int[B, T]
  are laid out like the sequence (attend within equal ids; with `shared_prefix`,
  keys of segment 0 are seen by every segment, as the learner packs a group's
  continuations after their prompt). The other mesh axes split the rest: kv heads
  over `head_axis` (default "tensor", where it divides them), the batch over every
  other axis (e.g. "data" and "fsdp" of the project's four-axis mesh) where it
  divides B; an axis that divides neither holds copies. Works on meshes of Auto or
  Explicit axes (`jax.make_mesh`), eagerly (compiled) and under jit.

  Layout of the sequence dimension (what the caller passes and gets back):
  - "natural" (default): token t at index t, sharded contiguously (device d holds
    T/n consecutive tokens). With causal=True the function moves the tokens to the
    zigzag layout internally (two `ppermute`s of half the local block on the way in,
    two for the output on the way out) so every device does the same work; with
    causal=False the contiguous layout is already balanced and nothing moves.
  - "zigzag": the caller already permuted the sequence with `zigzag_order(T, n)`
    (device i holds chunks i and 2n-1-i of 2n); no reordering is done.
  - "contiguous": natural order without balancing (the unbalanced baseline: device d
    does d+1 units of causal work).
  T must be divisible by n (by 2n for zigzag/natural+causal); otherwise a ValueError
  says which lengths work (pad the sequence and mask the padding with `kv_mask`).
  Inside each device, attention runs in [block_size, block_size] tiles (the local
  chunk is padded internally if block_size does not divide it).
  """
  flash.check_qkv(q, k, v, "ring_attention")
  if k.shape[1] != q.shape[1]:
    raise ValueError(f"ring_attention is self-attention: q has T={q.shape[1]} but k/v have "
                     f"S={k.shape[1]}")
  if axis_name not in mesh.shape:
    raise ValueError(f"ring_attention: mesh has axes {tuple(mesh.shape)}, no {axis_name!r}")
  if layout not in LAYOUTS:
    raise ValueError(f"ring_attention: layout must be one of {LAYOUTS}, got {layout!r}")
  B, T, H, D = q.shape
  KVH = k.shape[2]
  n = mesh.shape[axis_name]
  zig = layout == "zigzag" or (layout == "natural" and causal)
  div = 2 * n if zig else n
  if T % div:
    ok_len = -(-T // div) * div
    raise ValueError(
        f"ring_attention: sequence length T={T} is not divisible by "
        f"{'2 x ' if zig else ''}the {axis_name!r} axis size {n} (= {div}); pad to a "
        f"multiple of {div} (e.g. T={ok_len}) and mask the padding with kv_mask, or use "
        f"a mesh whose {axis_name!r} size divides T")
  if kv_mask is None:
    kv_mask = jnp.ones((B, T), bool)
  if segment_ids is None:
    segment_ids = jnp.zeros((B, T), jnp.int32)
  kv_mask = jnp.broadcast_to(kv_mask, (B, T)).astype(bool)
  segment_ids = jnp.broadcast_to(segment_ids, (B, T)).astype(jnp.int32)
  return _ring_attention(q, k, v, kv_mask, segment_ids, mesh=mesh, axis_name=axis_name,
                         causal=bool(causal), shared_prefix=bool(shared_prefix),
                         layout=layout, block_size=int(block_size), head_axis=head_axis)


@functools.partial(jax.jit, static_argnames=("mesh", "axis_name", "causal", "shared_prefix",
                                             "layout", "block_size", "head_axis"))
def _ring_attention(q, k, v, kv_mask, segment_ids, *, mesh, axis_name, causal, shared_prefix,
                    layout, block_size, head_axis):
  B, T, H, D = q.shape
  KVH = k.shape[2]
  n = mesh.shape[axis_name]
  zig = layout == "zigzag" or (layout == "natural" and causal)
  Tl = T // n
  blk = min(block_size, Tl // 2 if zig else Tl)
  Tp = -(-Tl // blk) * blk
  local_layout = "zigzag" if zig else "contiguous"
  permute = layout == "natural" and causal

  batch, heads = _split_axes(mesh, axis_name, head_axis, B, KVH)
  s5, s4, s2 = _ring_specs(axis_name, batch, heads)
  shard = functools.partial(jax.shard_map, mesh=mesh, check_vma=False)

  def arrive(q, k, v, ok, seg):
    """Per device: natural -> zigzag order if needed, then pad to whole blocks."""
    if permute:
      q, k, v, ok, seg = (_to_zigzag(x, axis_name, n) for x in (q, k, v, ok, seg))
    q5 = q.reshape(q.shape[0], Tl, k.shape[2], H // KVH, D)   # local batch and kv heads
    return (flash.pad_to(q5, Tp), flash.pad_to(k, Tp), flash.pad_to(v, Tp), flash.pad_to(seg, Tp),
            flash.pad_to(ok, Tp, False))

  def leave(o):
    o = o[:, :Tl].reshape(o.shape[0], Tl, -1, D).astype(q.dtype)
    return _from_zigzag(o, axis_name, n) if permute else o

  seq4 = P(batch, axis_name, heads, None)
  if jax.sharding.AxisType.Explicit in tuple(getattr(mesh, "axis_types", ())):
    # sharding in types: shard_map takes inputs already laid out as its in_specs
    q, k, v, kv_mask, segment_ids = (
        jax.reshard(x, jax.sharding.NamedSharding(mesh, spec)) for x, spec in
        ((q, seq4), (k, seq4), (v, seq4), (kv_mask, s2), (segment_ids, s2)))
  args = shard(arrive, in_specs=(seq4, seq4, seq4, s2, s2),
               out_specs=(s5, s4, s4, s2, s2))(q, k, v, kv_mask, segment_ids)
  meta = (axis_name, n, causal, 1.0 / math.sqrt(D), blk, Tl, local_layout, shared_prefix,
          (s5, s4, s2))
  o = _ring(*args, mesh, meta)
  return shard(leave, in_specs=s5, out_specs=seq4)(o)
