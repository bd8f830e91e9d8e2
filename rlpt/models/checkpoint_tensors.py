"""How checkpoint tensors (HF safetensors, GGUF) map onto the decoder's stacked parameters.

HF and GGUF store one tensor per layer in torch's Linear layout `[out, in]`; the
decoder stores each weight once for all layers (`[L, ...]`, see decoder.py) in
`[in, ..., out]` einsum layout. Each entry here names the checkpoint tensor and a
`kind` that says how one layout becomes the other (both directions are exact
reshapes / transposes, so a save-load round trip is bit-exact).
"""

from __future__ import annotations

import numpy as np

from rlpt.models.decoder import ModelConfig


class LoadError(ValueError):
  """A checkpoint that cannot become a model; the message names the file and tensor."""


def check_tensor(a: np.ndarray, want_shape: tuple[int, ...], source: str, tensor: str) -> np.ndarray:
  """Raises LoadError unless `a` is a floating array of `want_shape`; returns it as float32."""
  if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
    raise LoadError(f"{source}: tensor {tensor!r} has dtype {a.dtype}, expected a float type")
  if tuple(a.shape) != tuple(want_shape):
    raise LoadError(f"{source}: tensor {tensor!r} has shape {tuple(a.shape)}, expected "
                    f"{tuple(want_shape)}")
  return np.asarray(a, np.float32)


# our layer param -> (HF name template, GGUF name template, kind)
LAYER_TENSORS = {
    "attn_norm": ("model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight", "copy"),
    "wq": ("model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight", "q_in"),
    "wk": ("model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight", "kv_in"),
    "wv": ("model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight", "kv_in"),
    "wo": ("model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight", "o_out"),
    "bq": ("model.layers.{i}.self_attn.q_proj.bias", "blk.{i}.attn_q.bias", "q_bias"),
    "bk": ("model.layers.{i}.self_attn.k_proj.bias", "blk.{i}.attn_k.bias", "kv_bias"),
    "bv": ("model.layers.{i}.self_attn.v_proj.bias", "blk.{i}.attn_v.bias", "kv_bias"),
    "q_norm": ("model.layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight", "copy"),
    "k_norm": ("model.layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight", "copy"),
    "mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight",
                 "copy"),
    "w_gate": ("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", "T"),
    "w_up": ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", "T"),
    "w_down": ("model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight", "T"),
}
GLOBAL_TENSORS = {
    "embed": ("model.embed_tokens.weight", "token_embd.weight", "copy"),
    "final_norm": ("model.norm.weight", "output_norm.weight", "copy"),
    "lm_head": ("lm_head.weight", "output.weight", "T"),
}


def checkpoint_shape(kind: str, ours: tuple[int, ...], cfg: ModelConfig) -> tuple[int, ...]:
  """The checkpoint (torch-layout) shape of one layer's tensor whose decoder shape is `ours`."""
  if kind == "copy":
    return ours
  if kind == "T":
    return ours[::-1]
  if kind in ("q_in", "kv_in"):  # [D, N, Dh] <- [N*Dh, D]
    return (ours[1] * ours[2], ours[0])
  if kind == "o_out":  # [H, Dh, D] <- [D, H*Dh]
    return (ours[2], ours[0] * ours[1])
  if kind in ("q_bias", "kv_bias"):  # [N, Dh] <- [N*Dh]
    return (ours[0] * ours[1],)
  raise AssertionError(kind)


def to_ours(kind: str, a: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
  """Checkpoint layout -> decoder layout (shape `ours`, without the layer axis)."""
  if kind == "copy":
    return a
  if kind == "T":
    return a.T
  if kind in ("q_in", "kv_in"):
    return a.T.reshape(ours)
  if kind == "o_out":
    return a.T.reshape(ours)
  return a.reshape(ours)


def to_checkpoint(kind: str, a: np.ndarray) -> np.ndarray:
  """Decoder layout -> checkpoint layout (inverse of `to_ours`)."""
  if kind == "copy":
    return a
  if kind == "T":
    return a.T
  if kind in ("q_in", "kv_in"):
    return a.reshape(a.shape[0], -1).T
  if kind == "o_out":
    return a.reshape(-1, a.shape[-1]).T
  return a.reshape(-1)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation (interleaved RoPE pairs -> HF's halves).

  llama.cpp's converter reorders each head's rows from [first half, second half] to
  interleaved pairs; `w` is [n_heads*Dh, ...] (weights) or [n_heads*Dh] (biases).
  """
  dh = w.shape[0] // n_heads
  return w.reshape(n_heads, dh // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
