"""HF checkpoint directories: config.json + (sharded) safetensors + tokenizer.json.

`read_hf_checkpoint` maps a Llama / Qwen2 / Qwen3 directory onto the decoder;
`save_hf` writes one back (float32 safetensors, sharded with an index past
`max_shard_bytes`) that HF transformers and SGLang load, and that
`load_model` reads back bit-exactly.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rlpt.models.decoder import ARCHITECTURES, ModelConfig
from rlpt.models.checkpoint_tensors import (GLOBAL_TENSORS, LAYER_TENSORS, LoadError,
                                            check_tensor, to_checkpoint)
from rlpt.models.tokenizer import Tokenizer, load_tokenizer

_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def config_from_hf(conf: dict[str, Any], source: str) -> ModelConfig:
  """ModelConfig from a parsed config.json (legacy `rope_scaling` or v5 `rope_parameters`)."""
  arch = conf.get("model_type")
  if arch not in ARCHITECTURES:
    raise LoadError(f"{source}: unsupported architecture model_type={arch!r} "
                    f"(architectures={conf.get('architectures')}); expected one of {ARCHITECTURES}")

  def need(key):
    if key not in conf:
      raise LoadError(f"{source}: field {key!r} is missing")
    return conf[key]

  rope = dict(conf.get("rope_parameters") or conf.get("rope_scaling") or {})
  theta = float(rope.pop("rope_theta", conf.get("rope_theta", 10000.0)))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("default", "linear", "llama3"):
    raise LoadError(f"{source}: unsupported rope type {kind!r} (rope_scaling / rope_parameters)")
  rope.pop("type", None)
  rope["rope_type"] = kind
  scaling = None if kind == "default" else tuple(sorted(rope.items()))
  for flag, why in (("mlp_bias", "MLP biases"), ("use_sliding_window", "sliding-window attention")):
    if conf.get(flag):
      raise LoadError(f"{source}: field {flag!r}=true ({why}) is not supported")
  if arch == "llama" and conf.get("attention_bias"):
    raise LoadError(f"{source}: field 'attention_bias'=true (o_proj bias) is not supported")
  if arch == "qwen3" and conf.get("attention_bias"):
    raise LoadError(f"{source}: field 'attention_bias'=true is not supported for qwen3")
  if conf.get("hidden_act", "silu") != "silu":
    raise LoadError(f"{source}: field 'hidden_act'={conf['hidden_act']!r}, expected 'silu'")
  H = int(need("num_attention_heads"))
  D = int(need("hidden_size"))
  eos = conf.get("eos_token_id")
  return ModelConfig(
      arch=arch, vocab_size=int(need("vocab_size")), hidden_size=D,
      intermediate_size=int(need("intermediate_size")), num_layers=int(need("num_hidden_layers")),
      num_heads=H, num_kv_heads=int(conf.get("num_key_value_heads") or H),
      head_dim=int(conf.get("head_dim") or D // H), rms_norm_eps=float(conf.get("rms_norm_eps", 1e-6)),
      rope_theta=theta, rope_scaling=scaling,
      max_position_embeddings=int(conf.get("max_position_embeddings", 2048)),
      tie_word_embeddings=bool(conf.get("tie_word_embeddings", False)),
      qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", bos_token_id=conf.get("bos_token_id"),
      eos_token_id=eos[0] if isinstance(eos, list) else eos, pad_token_id=conf.get("pad_token_id"))


def _weight_files(path: str) -> dict[str, str]:
  """Tensor name -> safetensors file holding it (from the index, or the single file)."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
      raise LoadError(f"{index}: no 'weight_map'")
    out = {}
    for name, fname in weight_map.items():
      full = os.path.join(path, fname)
      if not os.path.isfile(full):
        raise FileNotFoundError(f"{index}: tensor {name!r} lives in {fname}, which is missing")
      out[name] = full
    return out
  single = os.path.join(path, "model.safetensors")
  if not os.path.isfile(single):
    raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
  with safe_open(single, framework="numpy") as f:
    return {k: single for k in f.keys()}


def read_hf_checkpoint(path: str):
  """(ModelConfig, read(name, kind, shape) -> np.ndarray, Tokenizer) for a checkpoint directory."""
  cpath = os.path.join(path, "config.json")
  if not os.path.isfile(cpath):
    raise FileNotFoundError(f"config file not found: {cpath}")
  with open(cpath) as f:
    conf = json.load(f)
  cfg = config_from_hf(conf, cpath)
  files = _weight_files(path)
  tok = load_tokenizer(path)
  handles: dict[str, Any] = {}
  lock = threading.Lock()  # `read` runs on a thread pool

  def read(key: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    name, _, layer = key.partition(":")
    table = LAYER_TENSORS if layer else GLOBAL_TENSORS
    tname = table[name][0].format(i=layer)
    if tname not in files:
      raise LoadError(f"{path}: tensor {tname!r} is missing from the checkpoint")
    fname = files[tname]
    with lock:
      if fname not in handles:
        handles[fname] = safe_open(fname, framework="numpy")
      h = handles[fname]
    sl = h.get_slice(tname)
    dtype, got_shape = sl.get_dtype(), tuple(sl.get_shape())
    if dtype not in _FLOAT_DTYPES:
      raise LoadError(f"{fname}: tensor {tname!r} has dtype {dtype}, expected one of "
                      f"{_FLOAT_DTYPES}")
    if got_shape != tuple(shape):
      raise LoadError(f"{fname}: tensor {tname!r} has shape {got_shape}, expected {tuple(shape)}")
    if dtype == "BF16":  # numpy has no bfloat16: widen the raw bits
      raw = _read_raw(fname, tname)
      a = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(got_shape)
    else:
      a = h.get_tensor(tname)
    return check_tensor(a, shape, fname, tname)

  return cfg, read, tok


def _read_raw(fname: str, tname: str) -> np.ndarray:
  """The raw bytes of one tensor of a safetensors file (header: u64 length + JSON)."""
  with open(fname, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(n))
    start, end = header[tname]["data_offsets"]
    f.seek(8 + n + start)
    return np.frombuffer(f.read(end - start), np.uint8)


def hf_config_dict(cfg: ModelConfig) -> dict[str, Any]:
  """config.json for `cfg` (legacy `rope_theta`/`rope_scaling` keys, read by old and new HF)."""
  out = {
      "architectures": [_HF_CLASSES[cfg.arch]], "model_type": cfg.arch,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta, "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling
      else None, "max_position_embeddings": cfg.max_position_embeddings,
      "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": "float32",
      "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
      "pad_token_id": cfg.pad_token_id, "attention_dropout": 0.0, "use_cache": True,
  }
  if cfg.arch == "llama":
    out.update(attention_bias=False, mlp_bias=False)
  elif cfg.arch == "qwen3":
    out.update(attention_bias=False)
  if cfg.arch in ("qwen2", "qwen3"):
    out.update(use_sliding_window=False, sliding_window=None,
               max_window_layers=cfg.num_layers)
  return out


def save_hf(model, tokenizer: Tokenizer | None, path: str, *,
            max_shard_bytes: int = 2 * 1024 ** 3) -> None:
  """Writes `model` (and `tokenizer`) as a HF checkpoint directory at `path`.

  Tensors are float32 in HF's names and layouts; more than `max_shard_bytes` of them
  are split over model-0000i-of-0000n.safetensors with model.safetensors.index.json.
  """
  import jax
  cfg: ModelConfig = model.config
  arrays = jax.tree.map(np.asarray, model.arrays())
  tensors: dict[str, np.ndarray] = {}
  for name, (hf_name, _, kind) in GLOBAL_TENSORS.items():
    if name in arrays:
      tensors[hf_name] = np.ascontiguousarray(to_checkpoint(kind, arrays[name]))
  for name, stacked in arrays["layers"].items():
    hf_name, _, kind = LAYER_TENSORS[name]
    for i in range(cfg.num_layers):
      tensors[hf_name.format(i=i)] = np.ascontiguousarray(to_checkpoint(kind, stacked[i]))
  os.makedirs(path, exist_ok=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for k, v in tensors.items():
    if shards[-1] and size + v.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][k] = v
    size += v.nbytes
  meta = {"format": "pt"}
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata=meta)
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, fname), metadata=meta)
      weight_map.update({k: fname for k in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
                 "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config_dict(cfg), f, indent=2)
  if tokenizer is not None:
    tokenizer.save(path)
