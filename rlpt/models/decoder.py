"""The decoder-only transformer shared by Llama (SmolLM2, Llama 3), Qwen2 and Qwen3.

One NNX module, `Decoder`, whose layers are stacked: every per-layer weight is a
single `nnx.Param` with a leading layer axis `L`, and the forward pass runs
`jax.lax.scan` over that axis (so compile time does not grow with depth).

Parameter tree (names are the attribute paths; shapes; logical axes in brackets):
  embed                [V, D]        ("vocab", "embed")
  layers.attn_norm     [L, D]        ("layers", "embed")
  layers.wq            [L, D, H, Dh] ("layers", "embed", "heads", "kv")
  layers.wk, wv        [L, D, K, Dh] ("layers", "embed", "heads", "kv")
  layers.wo            [L, H, Dh, D] ("layers", "heads", "kv", "embed")
  layers.bq            [L, H, Dh]    (Qwen2 only: `qkv_bias`)
  layers.bk, bv        [L, K, Dh]    (Qwen2 only)
  layers.q_norm,k_norm [L, Dh]       (Qwen3 only: `qk_norm`)
  layers.mlp_norm      [L, D]
  layers.w_gate, w_up  [L, D, F]     ("layers", "embed", "mlp")
  layers.w_down        [L, F, D]     ("layers", "mlp", "embed")
  final_norm           [D]
  lm_head              [D, V]        (only when embeddings are untied)
with V vocab, D hidden, H query heads, K key/value heads, Dh head dim, F MLP width.
Every Param carries its logical axes as the metadata field `logical_axes`.

Parameters are float32; `ModelConfig.dtype` is the compute dtype of the matmuls
(float32 or bfloat16). Norms, RoPE, softmax and the logits are float32.

Incremental decoding uses a preallocated `KVCache` (rlpt.models.kv_cache, layout
[L, B, K, S, Dh]): the T new tokens of row b go to cache slots index[b] ..
index[b]+T-1, `valid` records which slots hold real tokens, and a query in slot s
attends to slots j <= s that are valid.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlpt.models import kv_cache, projections
from rlpt.models.kv_cache import KVCache, init_cache  # noqa: F401 (re-exported)
from rlpt.models.projections import PROJECTIONS, proj as _proj
from rlpt.ops.attention import blockwise_attention
from rlpt.ops.dense_attention import causal_attention
from rlpt.ops.ring_attention import ring_attention

ARCHITECTURES = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")
COMPUTE_DTYPES = ("float32", "bfloat16")


# Tile of the blockwise attention long cache-free passes use (ModelConfig.blockwise_from).
BLOCKWISE_TILE = 512

@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of one decoder; hashable, so it can be a static jit argument.

  Attributes:
    arch: "llama", "qwen2" or "qwen3" (what `save_hf` writes as model_type).
    vocab_size: V, rows of the embedding.
    hidden_size: D, width of the residual stream.
    intermediate_size: F, width of the SwiGLU MLP.
    num_layers: L.
    num_heads: H, query heads.
    num_kv_heads: K, key/value heads (GQA: H is a multiple of K).
    head_dim: Dh.
    rms_norm_eps: epsilon inside every RMSNorm.
    rope_theta: RoPE base.
    rope_scaling: None or a tuple of (key, value) pairs as in HF's `rope_scaling`
      (`rope_type` "default", "linear" or "llama3").
    max_position_embeddings: the longest context the checkpoint claims.
    tie_word_embeddings: the output projection is `embed.T`.
    qkv_bias: Q/K/V projections have biases (Qwen2).
    qk_norm: RMSNorm over Dh on queries and keys before RoPE (Qwen3).
    dtype: compute dtype, "float32" or "bfloat16"; parameters stay float32.
    remat: rematerialise each layer's activations in the backward pass.
    blockwise_from: cache-free passes of this many tokens or more (the prefill of a
      long prompt, a long packed sequence) attend in [block, block] tiles
      (`rlpt.ops.attention.blockwise_attention`, O(T) memory) instead of materialising
      [T, T] scores; 0 = never. Sequence-sharded meshes use ring attention instead.
    decode_kernel: one-token steps over a KV cache use rlpt's CPU kernel
      (`rlpt.ops.decode_attention`, which reads each row only up to its length) when
      they run on CPU in float32; False: XLA ops only. Under a multi-device mesh the
      kernel's inputs are gathered to every device (correct, slower): JaxEngine turns
      it off when its weights span several devices.
    bos_token_id, eos_token_id, pad_token_id: carried through to `save_hf`.
  """

  arch: str = "llama"
  vocab_size: int = 256
  hidden_size: int = 64
  intermediate_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  max_position_embeddings: int = 2048
  tie_word_embeddings: bool = True
  qkv_bias: bool = False
  qk_norm: bool = False
  dtype: str = "float32"
  remat: bool = False
  decode_kernel: bool = True
  blockwise_from: int = 4096
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  pad_token_id: int | None = None

  def __post_init__(self):
    if self.arch not in ARCHITECTURES:
      raise ValueError(f"ModelConfig.arch: unsupported architecture {self.arch!r}; "
                       f"expected one of {ARCHITECTURES}")
    if self.dtype not in COMPUTE_DTYPES:
      raise ValueError(f"ModelConfig.dtype: {self.dtype!r} is not one of {COMPUTE_DTYPES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig: num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    rope_type = self.rope_scaling_dict.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
      raise ValueError(f"ModelConfig.rope_scaling: unsupported rope type {rope_type!r}; "
                       f"expected one of {ROPE_TYPES}")

  @property
  def rope_scaling_dict(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


# Stacked per-layer weights: name -> (shape given config, logical axes, init kind).
def layer_param_specs(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], str]]:
  """Shapes (without the leading L), logical axes (with "layers") and init of layer weights."""
  D, H, K, Dh, F = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, \
      cfg.intermediate_size
  specs = {
      "attn_norm": ((D,), ("layers", "embed"), "ones"),
      "wq": ((D, H, Dh), ("layers", "embed", "heads", "kv"), "normal"),
      "wk": ((D, K, Dh), ("layers", "embed", "heads", "kv"), "normal"),
      "wv": ((D, K, Dh), ("layers", "embed", "heads", "kv"), "normal"),
      "wo": ((H, Dh, D), ("layers", "heads", "kv", "embed"), "normal"),
      "mlp_norm": ((D,), ("layers", "embed"), "ones"),
      "w_gate": ((D, F), ("layers", "embed", "mlp"), "normal"),
      "w_up": ((D, F), ("layers", "embed", "mlp"), "normal"),
      "w_down": ((F, D), ("layers", "mlp", "embed"), "normal"),
  }
  if cfg.qkv_bias:
    specs["bq"] = ((H, Dh), ("layers", "heads", "kv"), "zeros")
    specs["bk"] = ((K, Dh), ("layers", "heads", "kv"), "zeros")
    specs["bv"] = ((K, Dh), ("layers", "heads", "kv"), "zeros")
  if cfg.qk_norm:
    specs["q_norm"] = ((Dh,), ("layers", "kv"), "ones")
    specs["k_norm"] = ((Dh,), ("layers", "kv"), "ones")
  return specs


def param_specs(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], str]]:
  """Every parameter as flat path "a.b" -> (full shape, logical axes, init kind)."""
  out = {"embed": ((cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), "normal")}
  for name, (shape, axes, init) in layer_param_specs(cfg).items():
    out[f"layers.{name}"] = ((cfg.num_layers,) + shape, axes, init)
  out["final_norm"] = ((cfg.hidden_size,), ("embed",), "ones")
  if not cfg.tie_word_embeddings:
    out["lm_head"] = ((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), "normal")
  return out


def _init_value(key, shape, kind, std=0.02):
  if kind == "ones":
    return jnp.ones(shape, jnp.float32)
  if kind == "zeros":
    return jnp.zeros(shape, jnp.float32)
  return std * jax.random.normal(key, shape, jnp.float32)


class DecoderLayers(nnx.Module):
  """The L transformer blocks, each weight stacked along a leading layer axis."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    for name, (shape, axes, init) in layer_param_specs(cfg).items():
      value = _init_value(rngs.params(), (cfg.num_layers,) + shape, init)
      setattr(self, name, nnx.Param(value, logical_axes=axes))

  def arrays(self) -> dict[str, jax.Array]:
    return {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}


class Decoder(nnx.Module):
  """Token ids -> next-token logits; see the module docstring for the parameter tree.

  Call: `model(tokens_BxT, positions=None, attention_mask=None, cache=None)`.
    tokens_BxT: int32[B, T].
    positions: int32[B, T] RoPE positions; default: the number of real tokens
      before each token in its row (0 at the first real token after left padding,
      continuing from the cache's valid slots when a cache is given).
    attention_mask: bool/int[B, T], 1 for real tokens, 0 for padding; default all 1.
    cache: a `KVCache`; when given the call returns (logits, new_cache).
  Returns float32[B, T, V] logits (and the updated cache when one was given).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = nnx.Param(_init_value(rngs.params(), (config.vocab_size, config.hidden_size),
                                       "normal"), logical_axes=("vocab", "embed"))
    self.layers = DecoderLayers(config, rngs=rngs)
    self.final_norm = nnx.Param(jnp.ones((config.hidden_size,), jnp.float32),
                                logical_axes=("embed",))
    if not config.tie_word_embeddings:
      self.lm_head = nnx.Param(_init_value(rngs.params(), (config.hidden_size, config.vocab_size),
                                           "normal"), logical_axes=("embed", "vocab"))

  def arrays(self) -> dict[str, Any]:
    """The parameters as a plain nested dict of arrays (what `forward` takes)."""
    out = {"embed": self.embed[...], "layers": self.layers.arrays(),
           "final_norm": self.final_norm[...]}
    if not self.config.tie_word_embeddings:
      out["lm_head"] = self.lm_head[...]
    return out

  def __call__(self, tokens_BxT, positions=None, attention_mask=None, cache=None):
    return forward(self.config, self.arrays(), tokens_BxT, positions=positions,
                   attention_mask=attention_mask, cache=cache)


def rms_norm(x, weight, eps):
  """RMSNorm over the last axis, in float32 (HF's order: normalise, cast, scale)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight * y


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """float32[Dh/2] inverse frequencies, with "linear" or "llama3" scaling applied.

  A constant of the config, computed in float64 with numpy and rounded once to
  float32 (so it is the same under jit and eagerly, and as exact as float32 allows).
  """
  dh = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
  sc = cfg.rope_scaling_dict
  kind = sc.get("rope_type", sc.get("type", "default"))
  if kind == "linear":
    inv = inv / float(sc["factor"])
  elif kind == "llama3":
    factor = float(sc["factor"])
    low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old_len = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv = np.where(medium, smoothed, scaled)
  return inv.astype(np.float32)


def apply_rope(x_BxTxNxDh, cos_BxTxDh, sin_BxTxDh):
  """Rotates halves (HF's `rotate_half` layout): x*cos + rotate_half(x)*sin."""
  half = x_BxTxNxDh.shape[-1] // 2
  x1, x2 = x_BxTxNxDh[..., :half], x_BxTxNxDh[..., half:]
  rot = jnp.concatenate([-x2, x1], axis=-1)
  return x_BxTxNxDh * cos_BxTxDh[:, :, None, :] + rot * sin_BxTxDh[:, :, None, :]


def _qkv(cfg, p, x_BxTxD, cos, sin):
  dt = cfg.compute_dtype
  h = rms_norm(x_BxTxD, p["attn_norm"], cfg.rms_norm_eps)
  q = _proj(h, p["wq"], PROJECTIONS["wq"], dt)
  k = _proj(h, p["wk"], PROJECTIONS["wk"], dt)
  v = _proj(h, p["wv"], PROJECTIONS["wv"], dt)
  if cfg.qkv_bias:
    q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
  if cfg.qk_norm:
    q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
  return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _finish_block(cfg, p, x_BxTxD, attn_BxTxHxDh):
  dt = cfg.compute_dtype
  x = x_BxTxD + _proj(attn_BxTxHxDh, p["wo"], PROJECTIONS["wo"], dt)
  h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
  return x + _mlp(h, p["w_gate"], p["w_up"], p["w_down"], dt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _mlp(h_BxTxD, w_gate, w_up, w_down, dt):
  """SwiGLU MLP: (silu(h Wg) * (h Wu)) Wd, float32[B, T, D].

  Its backward pass is written out (same math as autodiff) so that every weight
  gradient is a dot contracting the two operands' leading (b, t) axes, which
  XLA:CPU's dot runs on the operands as stored; autodiff's form made it transpose
  the [B*T, F] activation gradients first (two copy fusions per layer, ~12 % of a
  learner step at B=4, T=256 on SmolLM2), and kept four [B, T, F] residuals where
  this keeps two (the gate and up projections)."""
  return _mlp_fwd(h_BxTxD, w_gate, w_up, w_down, dt)[0]


def _mlp_fwd(h, w_gate, w_up, w_down, dt):
  g = _proj(h, w_gate, PROJECTIONS["w_gate"], dt)
  u = _proj(h, w_up, PROJECTIONS["w_up"], dt)
  return (_proj(jax.nn.silu(g) * u, w_down, PROJECTIONS["w_down"], dt),
          (h, w_gate, w_up, w_down, g, u))


def _mlp_bwd(dt, res, dy):
  h, w_gate, w_up, w_down, g, u = res
  f32 = jnp.float32
  ein = lambda eq, a, b: jnp.einsum(  # noqa: E731
      eq, projections.dot_operand(a, dt), projections.dot_operand(b, dt),
      preferred_element_type=f32)
  sg = jax.nn.sigmoid(g)
  a = g * sg * u                                            # silu(g) * u
  da = ein("btd,fd->btf", dy, w_down)
  dg = da * u * (sg * (1 + g * (1 - sg)))                   # d silu(g) / dg
  du = da * g * sg
  # As (dy^T a)^T: XLA:CPU's dot wants a [F, B*T] left operand for a^T dy and builds it
  # in a strided transposing fusion from g, sigmoid(g) and u (7.6 ms per layer for
  # 512 tokens, ~5 % of a learner step); transposing dy (576 wide) and the [D, F]
  # result is cheaper (B=8 step: 12.31 s against 12.70 s, 5 alternating rounds).
  dw_down = ein("btd,btf->df", dy, a).T
  dw_gate = ein("btd,btf->df", h, dg)
  dw_up = ein("btd,btf->df", h, du)
  dh = ein("btf,df->btd", dg, w_gate) + ein("btf,df->btd", du, w_up)
  return (dh.astype(h.dtype), dw_gate.astype(w_gate.dtype), dw_up.astype(w_up.dtype),
          dw_down.astype(w_down.dtype))


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def _maybe_remat(cfg, f):
  return jax.checkpoint(f, prevent_cse=False) if cfg.remat else f


def forward(cfg: ModelConfig, params: dict[str, Any], tokens_BxT, *, positions=None,
            attention_mask=None, cache: KVCache | None = None, return_hidden: bool = False,
            segment_ids=None, return_kv: bool = False):
  """The pure forward pass; `Decoder.__call__` calls it with `Decoder.arrays()`.

  With `return_hidden` the result is the final-normed hidden states float32[B, T, D]
  instead of logits (see `output_logits`), e.g. to project to the vocabulary in chunks.

  With `return_kv` (no cache) the result is (out, (k, v)), every layer's keys (after
  RoPE) and values float32[L, B, T, K, Dh]: what a prefill puts into a KV cache.

  `segment_ids` (int32[B, T], no cache) packs several sequences that share a prefix
  into one row: segment 0 is the shared prefix, segments 1, 2, ... are continuations
  of it, negative ids are padding. A token attends causally to earlier tokens of its
  own segment and of segment 0, so continuation i computes exactly what the row
  prefix + continuation i would on its own (give each continuation's `positions`
  as that row's). Used by the learner to run each group's prompt once
  (rlpt.train.packing).
  """
  tokens_BxT = jnp.asarray(tokens_BxT, jnp.int32)
  B, T = tokens_BxT.shape
  mask_BxT = (jnp.ones((B, T), bool) if attention_mask is None
              else jnp.asarray(attention_mask).astype(bool))
  seg_BxT = None
  if return_kv and cache is not None:
    raise ValueError("forward: return_kv is for cache-free passes (a cached call returns "
                     "the updated cache)")
  if segment_ids is not None:
    if cache is not None:
      raise ValueError("forward: segment_ids (shared-prefix packing) is for cache-free "
                       "passes; got a cache too")
    seg_BxT = jnp.asarray(segment_ids, jnp.int32)
    mask_BxT = mask_BxT & (seg_BxT >= 0)
  if positions is None:
    before = 0 if cache is None else jnp.sum(cache.valid, axis=1, dtype=jnp.int32)[:, None]
    positions = before + jnp.maximum(jnp.cumsum(mask_BxT, axis=1, dtype=jnp.int32) - 1, 0)
  angles = jnp.asarray(positions, jnp.float32)[..., None] * rope_inv_freq(cfg)
  angles = jnp.concatenate([angles, angles], axis=-1)
  cos, sin = jnp.cos(angles), jnp.sin(angles)

  x = params["embed"][tokens_BxT].astype(jnp.float32)
  layers = params["layers"]
  if isinstance(layers, tuple) and cache is None:
    raise ValueError("forward: per-layer weights (`projections.unstack_layers`) are for "
                     "calls with a cache; give cache-free passes the stacked params")
  L = cfg.num_layers

  if cache is None:
    ctx_mesh = jax.sharding.get_abstract_mesh()  # set by `with jax.set_mesh(mesh):`
    if ctx_mesh.shape.get("seq", 1) > 1:  # context parallel: ring attention over "seq"
      n_seq = ctx_mesh.shape["seq"]
      if T % (2 * n_seq):
        raise ValueError(f"forward: a sequence of T={T} tokens cannot be split over the "
                         f"'seq' mesh axis of size {n_seq} (ring attention's zigzag layout "
                         f"needs T divisible by 2 x seq = {2 * n_seq}); pad the batch to a "
                         f"multiple of {2 * n_seq}")
      dt = cfg.compute_dtype
      attend = lambda q, k, v: ring_attention(  # noqa: E731
          *(projections.dot_operand(a, dt) for a in (q, k, v)), mesh=ctx_mesh,
          axis_name="seq",
          causal=True, kv_mask=mask_BxT, segment_ids=seg_BxT,
          shared_prefix=seg_BxT is not None).astype(jnp.float32)
    elif cfg.blockwise_from and T >= cfg.blockwise_from:  # long: tiles, never [T, T]
      dt = cfg.compute_dtype
      attend = lambda q, k, v: blockwise_attention(  # noqa: E731
          *(projections.dot_operand(a, dt) for a in (q, k, v)), causal=True, kv_mask=mask_BxT,
          q_segment_ids=seg_BxT, kv_segment_ids=seg_BxT, shared_prefix=seg_BxT is not None,
          block_q=BLOCKWISE_TILE, block_k=BLOCKWISE_TILE).astype(jnp.float32)
    else:
      causal = jnp.tril(jnp.ones((T, T), bool))
      attn_mask = causal[None] & mask_BxT[:, None, :]
      if seg_BxT is not None:  # own segment or the shared prefix (segment 0)
        k_seg = seg_BxT[:, None, :]
        attn_mask = attn_mask & ((k_seg == seg_BxT[:, :, None]) | (k_seg == 0))
      # Rematerialised: the backward pass recomputes the [B, K, G, T, T] probabilities
      # (a few hundred MFLOP per layer) instead of stacking them for all layers.
      attend = jax.checkpoint(  # noqa: E731
          lambda q, k, v: causal_attention(q, k, v, attn_mask, cfg.compute_dtype))

    constrain = _activation_sharding(ctx_mesh)

    def block(x, p):
      q, k, v = _qkv(cfg, p, x, cos, sin)
      out = constrain(_finish_block(cfg, p, x, attend(q, k, v)))
      return out, ((k, v) if return_kv else None)

    x, kv = jax.lax.scan(_maybe_remat(cfg, block), x, layers)
    new_cache = None
  else:  # attention over the cache plus the new tokens; the cache is written after the scan
    def block(x, p, layer):
      q, k, v = _qkv(cfg, p, x, cos, sin)
      att = kv_cache.attend(q, k, v, mask_BxT, cache, layer, cfg.compute_dtype,
                            use_kernel=cfg.decode_kernel)
      return _finish_block(cfg, p, x, att), (k, v)

    if isinstance(layers, tuple):
      # Per-layer arrays (`unstack_layers`): the scan picks layer l's own arrays with
      # `lax.switch`, so no weight is sliced (and copied) out of an [L, ...] stack.
      branches = [functools.partial(lambda i, x: block(x, layers[i], i), i) for i in range(L)]
      x, (new_k, new_v) = jax.lax.scan(lambda x, l: jax.lax.switch(l, branches, x), x,
                                       jnp.arange(L, dtype=jnp.int32))
    else:
      x, (new_k, new_v) = jax.lax.scan(lambda x, xs: block(x, *xs), x,
                                       (layers, jnp.arange(L, dtype=jnp.int32)))
    new_cache = kv_cache.write(cache, new_k, new_v, mask_BxT)

  out = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
  if not return_hidden:
    out = output_logits(cfg, params, out)
  if cache is None:
    return (out, kv) if return_kv else out
  return out, new_cache


def _activation_sharding(mesh):
  """Under a context mesh (`jax.set_mesh`), pins each layer's output [B, T, D] to the
  rules table's ("batch", "length", -): batch over data/fsdp, sequence over seq. Left
  to propagation, a batch of several sequences came out unsharded over fsdp (every
  device holding every sequence's activations: launch.plan's 1M-token, batch-4 step
  needed 3.6x the temporaries)."""
  if not mesh.shape:
    return lambda x: x
  from rlpt.models.sharding import logical_to_spec

  def constrain(x_BxTxD):
    spec = logical_to_spec(("batch", "length", None), x_BxTxD.shape, mesh)
    return jax.lax.with_sharding_constraint(x_BxTxD, spec)
  return constrain


def output_logits(cfg: ModelConfig, params: dict[str, Any], h_BxTxD):
  """Final hidden states -> float32[B, T, V] logits (tied `embed.T` or `lm_head`)."""
  if cfg.tie_word_embeddings:
    return _proj(h_BxTxD, params["embed"], "btd,vd->btv", cfg.compute_dtype)
  return _proj(h_BxTxD, params["lm_head"], "btd,dv->btv", cfg.compute_dtype)
