"""The decoder's weight projections: einsums with CPU-blocked float32 contractions.

`proj(x, w, eq, dt)` is every matmul of `rlpt.models.decoder` (named in
`PROJECTIONS`, plus the output head). On XLA:CPU it sums each long contraction in
blocks of <= 192 terms (the accuracy of MKL's sgemm, which HF/torch use);
`unstack_layers` gives the decode loop per-layer weights already split into those
blocks, so no weight is sliced out of the layer stacks on every step.

The blocking is a numerics choice for parity on this CPU, not the accelerator's
program: `accelerator_dots()` turns it off for what is traced inside it (launch.plan
compiles the step an accelerator would run under it, so a CPU-only parity trick does
not inflate a memory plan).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from rlpt.ops.dots import (  # noqa: F401 (re-exported: rlpt.models.projections.*)
    accelerator_dots, cpu_blocking, dot_operand, emulates_bf16)

# The decoder's layer projections: weight name -> einsum of (activations, that weight).
PROJECTIONS = {"wq": "btd,dhk->bthk", "wk": "btd,dhk->bthk", "wv": "btd,dhk->bthk",
               "wo": "bthk,hkd->btd", "w_gate": "btd,df->btf", "w_up": "btd,df->btf",
               "w_down": "btf,fd->btd"}

# Contraction block for float32 projections on CPU (see `proj`).
_CPU_DOT_BLOCK = 192


def proj(x, w, eq, dt):
  """einsum(eq, x, w) in dtype `dt` with float32 accumulation; eq contracts x's last axes.

  A bfloat16 `dt` is emulated on XLA:CPU (rlpt.ops.dots.dot_operand).

  On the CPU backend the contraction (the first contracted letter of `eq`) is split
  into blocks of <= `_CPU_DOT_BLOCK` terms whose partial sums are then added: XLA:CPU's
  dot keeps one running float32 sum over the whole contraction, whose rounding error
  grows with its length (SmolLM2's 30 layers then land ~1.5x further from the float64
  logits than HF's float32). Blocked, each sum is short, as in MKL's sgemm (which torch
  uses): the error drops to HF's. Same FLOPs, one dot per block added in order
  (measured: SmolLM2 logits 7.6e-5 from HF fp32; a single batched dot over a block axis
  was 2.4x slower on XLA:CPU at 64 rows, the per-block dots ~15 % over one plain dot).
  On accelerators, and when the block axis is not the weight's leading one (the tied
  `embed`), the plain einsum is used.
  """
  xs, ws, contracted = _contracted(eq)
  if isinstance(w, tuple):  # already split into row blocks (`unstack_layers`)
    return _einsum_row_blocks(dot_operand(x, dt), tuple(dot_operand(b, dt) for b in w), eq)
  x, w = dot_operand(x, dt), dot_operand(w, dt)
  total = math.prod(x.shape[xs.index(c)] for c in contracted)
  letter = contracted[0]
  blocks = cpu_dot_blocks(total, x.shape[xs.index(letter)])
  if (not cpu_blocking() or blocks == 1
      or not ws.startswith(letter)):  # splitting a minor weight axis would copy the weight
    return jnp.einsum(eq, x, w, preferred_element_type=jnp.float32)

  return _blocked_einsum(x, w, eq, blocks)


def _contracted(eq: str) -> tuple[str, str, list[str]]:
  """(x's subscripts, w's subscripts, the contracted letters in x's order) of
  einsum(eq, x, w)."""
  ins, out = eq.split("->")
  xs, ws = ins.split(",")
  return xs, ws, [c for c in xs if c in ws and c not in out]


def cpu_dot_blocks(total: int, n: int) -> int:
  """How many blocks `proj` splits a CPU contraction of `total` terms into, along an
  axis of n entries (the first contracted one): the fewest that keep each block at
  <= `_CPU_DOT_BLOCK` terms and divide n; 1 (no split) when that would take more
  than n blocks."""
  blocks = -(-total // _CPU_DOT_BLOCK)
  while blocks < n and n % blocks:
    blocks += 1
  return blocks if blocks <= n else 1


def unstack_layers(params: dict[str, Any]) -> dict[str, Any]:
  """`params` with "layers" as a tuple of L per-layer dicts, for one-token decode steps.

  `rlpt.models.decoder.forward` with a cache then picks each layer's own arrays with
  `lax.switch` instead of slicing them from the [L, ...] stacks, which XLA:CPU copies
  before every dot (all of the layer weights once per decode step). On CPU each
  projection weight is also pre-split into the row blocks `proj` would sum over (a
  tuple), so no block is sliced either; the result is the same computation in the
  same order. Costs a second copy of the layer weights. Only for cached calls (the
  layer scans of cache-free passes need the stacks).
  """
  stacked = params["layers"]
  L = jax.tree.leaves(stacked)[0].shape[0]
  layers = tuple(_layer_blocks({k: v[i] for k, v in stacked.items()}) for i in range(L))
  return dict(params, layers=layers)


def unstack_layers_jit(params: dict[str, Any], dtype: Any = None) -> dict[str, Any]:
  """`unstack_layers(params)` with the layer projections (and an untied `lm_head`) cast
  to `dtype` (None: kept), as L calls of one small compiled program (`_decode_layer`)
  instead of ~28 eager slices and casts a layer: for SmolLM2-135M ≈0.05 s instead of
  ≈0.4 s a weight swap, after a one-off compile of ≈2 s (one program for all L layers
  would take ≈10 s to compile). Same arrays, bit for bit."""
  stacked = params["layers"]
  L = jax.tree.leaves(stacked)[0].shape[0]
  dtype = None if dtype is None else jnp.dtype(dtype)
  layers = tuple(_decode_layer(stacked, i, dtype=dtype, blocking=cpu_blocking())
                 for i in range(L))
  return dict(cast_projections(dict(params, layers={}), dtype), layers=layers)


def cast_projections(params: dict[str, Any], dtype: Any = None) -> dict[str, Any]:
  """`params` with the layer projections (`PROJECTIONS`) and an untied `lm_head` in
  `dtype` (None: unchanged); norms, biases and the embedding keep theirs."""
  if dtype is None:
    return params
  out = dict(params, layers=_cast_layer(params["layers"], dtype))
  if "lm_head" in out:   # untied output head: only ever a projection
    out["lm_head"] = out["lm_head"].astype(dtype)
  return out


def _cast_layer(layer: dict[str, Any], dtype: Any) -> dict[str, Any]:
  return {k: (v.astype(dtype) if k in PROJECTIONS else v) for k, v in layer.items()}


@functools.partial(jax.jit, static_argnames=("dtype", "blocking"))
def _decode_layer(stacked: dict[str, Any], i: jax.Array, *, dtype: Any,
                  blocking: bool) -> dict[str, Any]:
  """Layer `i` (traced: one program for every layer) of the [L, ...] stacks, its
  projections cast to `dtype` and split as `unstack_layers` splits them. `blocking`
  (= cpu_blocking() at the call) only keys the compile cache: `_layer_blocks` reads
  it while tracing."""
  del blocking
  layer = {k: jax.lax.dynamic_index_in_dim(v, i, keepdims=False) for k, v in stacked.items()}
  return _layer_blocks(layer if dtype is None else _cast_layer(layer, dtype))


def _layer_blocks(layer: dict[str, Any]) -> dict[str, Any]:
  """One layer's weights with each projection split into `proj`'s CPU row blocks (a
  tuple; the weight itself when not blocking)."""
  if not cpu_blocking():
    return layer

  def blocks(name, w):
    eq = PROJECTIONS.get(name)
    if eq is None:
      return w
    nc = len(_contracted(eq)[2])  # the weight's leading axes are the contracted ones
    n = cpu_dot_blocks(math.prod(w.shape[:nc]), w.shape[0])
    if n == 1:
      return (w,)
    step = w.shape[0] // n
    return tuple(w[i * step:(i + 1) * step] for i in range(n))

  return {k: blocks(k, v) for k, v in layer.items()}


def _einsum_row_blocks(x, blocks, eq: str):
  """einsum(eq, x, concat(blocks)) for weights given as consecutive blocks along their
  leading axis, the first contracted one: one dot per block, added in order."""
  xs, _, contracted = _contracted(eq)
  xi, off, acc = xs.index(contracted[0]), 0, None
  for w in blocks:
    step = w.shape[0]
    part = jnp.einsum(eq, jax.lax.slice_in_dim(x, off, off + step, axis=xi), w,
                      preferred_element_type=jnp.float32)
    acc = part if acc is None else acc + part
    off += step
  return acc


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _blocked_einsum(x, w, eq: str, blocks: int):
  """einsum(eq, x, w) as one dot per block of the first contracted axis (contiguous
  row blocks of the weight, no copy), added in order: as fast as one dot on XLA:CPU
  (a batched dot over a block axis is not). The backward pass is the plain einsum's:
  only the forward's accumulation order matters for parity, and differentiating the
  slices would pad every block's gradient back to full size."""
  step = w.shape[0] // blocks  # `proj` splits only a leading weight axis
  return _einsum_row_blocks(
      x, tuple(jax.lax.slice_in_dim(w, i * step, (i + 1) * step) for i in range(blocks)), eq)


def _blocked_einsum_fwd(x, w, eq, blocks):
  return _blocked_einsum(x, w, eq, blocks), (x, w)


def _blocked_einsum_bwd(eq, blocks, res, g):
  del blocks
  x, w = res
  _, vjp = jax.vjp(lambda a, b: jnp.einsum(eq, a, b, preferred_element_type=jnp.float32), x, w)
  return vjp(g.astype(jnp.float32))


_blocked_einsum.defvjp(_blocked_einsum_fwd, _blocked_einsum_bwd)
