"""Reading a GGUF file: its metadata, and its tensors dequantized to float32 numpy arrays.

`gguf.GGUFReader` builds one numpy view per metadata string part, which takes ~9 s
on SmolLM2's 98k tokenizer strings here; this reader walks the same header layout
(GGUF v2/v3: magic, version, counts, key/values, tensor infos, aligned data) with
`struct` over an `mmap` and hands the tensor bytes to `gguf.quants.dequantize`.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quant_shape_to_byte_shape

_MAGIC = b"GGUF"
# Value types of the GGUF key/value section (gguf.GGUFValueType numbering).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
       6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


class GGUFError(ValueError):
  """A GGUF file that cannot be read; the message names the file (and tensor / key)."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  shape: tuple[int, ...]  # row-major (numpy / torch) order: GGUF's ne reversed
  qtype: GGMLQuantizationType
  offset: int  # absolute byte offset in the file
  nbytes: int


class GGUFFile:
  """An open GGUF file: `metadata` (key -> python value), `tensors` (name -> TensorInfo)."""

  def __init__(self, path: str):
    self.path = os.fspath(path)
    if not os.path.isfile(self.path):
      raise FileNotFoundError(f"GGUF file not found: {self.path}")
    with open(self.path, "rb") as f:
      self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
      self._parse()
    except (struct.error, UnicodeDecodeError, IndexError) as e:
      raise GGUFError(f"{self.path}: truncated or corrupt GGUF header ({e})") from e

  def _parse(self):
    buf, pos = self._buf, 0
    if buf[:4] != _MAGIC:
      raise GGUFError(f"{self.path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
      raise GGUFError(f"{self.path}: unsupported GGUF version {version} (expected 2 or 3)")
    pos = 4 + 4 + 8 + 8

    def read_str(pos):
      (n,) = struct.unpack_from("<Q", buf, pos)
      return buf[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n

    def read_value(vtype, pos):
      if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
      if vtype == _STRING:
        return read_str(pos)
      if vtype == _ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _NP:
          arr = np.frombuffer(buf, _NP[etype], count=n, offset=pos)
          return arr.tolist(), pos + arr.nbytes
        out = []
        for _ in range(n):
          v, pos = read_value(etype, pos)
          out.append(v)
        return out, pos
      raise GGUFError(f"{self.path}: unknown metadata value type {vtype} at byte {pos}")

    meta: dict[str, Any] = {}
    for _ in range(n_kv):
      key, pos = read_str(pos)
      (vtype,) = struct.unpack_from("<I", buf, pos)
      meta[key], pos = read_value(vtype, pos + 4)
    infos = []
    for _ in range(n_tensors):
      name, pos = read_str(pos)
      (n_dims,) = struct.unpack_from("<I", buf, pos)
      ne = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
      qtype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
      pos += 4 + 8 * n_dims + 12
      infos.append((name, tuple(int(x) for x in reversed(ne)), qtype, offset))
    align = int(meta.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    self.metadata = meta
    self.tensors: dict[str, TensorInfo] = {}
    for name, shape, qtype, offset in infos:
      try:
        qt = GGMLQuantizationType(qtype)
      except ValueError:
        raise GGUFError(f"{self.path}: tensor {name!r} has unknown ggml type {qtype}") from None
      nbytes = int(np.prod(quant_shape_to_byte_shape(shape, qt)))
      if data_start + offset + nbytes > len(buf):
        raise GGUFError(f"{self.path}: tensor {name!r} runs past the end of the file")
      self.tensors[name] = TensorInfo(name, shape, qt, data_start + offset, nbytes)

  def read(self, name: str) -> np.ndarray:
    """The tensor `name` as float32, in row-major (torch) order."""
    if name not in self.tensors:
      raise GGUFError(f"{self.path}: tensor {name!r} is missing")
    t = self.tensors[name]
    raw = np.frombuffer(self._buf, np.uint8, count=t.nbytes, offset=t.offset)
    byte_shape = quant_shape_to_byte_shape(t.shape, t.qtype)
    try:
      out = dequantize(raw.reshape(byte_shape), t.qtype)
    except NotImplementedError as e:
      raise GGUFError(f"{self.path}: tensor {name!r}: {e}") from e
    return np.asarray(out, np.float32).reshape(t.shape)

  def close(self):
    self._buf.close()


def config_from_gguf(g: GGUFFile):
  """The decoder's ModelConfig from a GGUF's `{arch}.*` metadata."""
  from rlpt.models.decoder import ARCHITECTURES, ModelConfig
  from rlpt.models.checkpoint_tensors import LoadError
  m, src = g.metadata, g.path
  arch = m.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise LoadError(f"{src}: unsupported architecture {arch!r} (general.architecture); "
                    f"expected one of {ARCHITECTURES}")

  def get(key, default=None):
    full = f"{arch}.{key}"
    if full not in m:
      if default is None:
        raise LoadError(f"{src}: metadata key {full!r} is missing")
      return default
    return m[full]

  D, H = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(get("attention.key_length", D // H))
  rot = int(get("rope.dimension_count", head_dim))
  if rot != head_dim:
    raise LoadError(f"{src}: partial rotary embeddings ({arch}.rope.dimension_count={rot}, "
                    f"head_dim={head_dim}) are not supported")
  scaling = m.get(f"{arch}.rope.scaling.type", "none")
  rope_scaling = None
  if scaling == "linear":
    rope_scaling = (("rope_type", "linear"), ("factor", float(get("rope.scaling.factor"))))
  elif scaling != "none":
    raise LoadError(f"{src}: unsupported rope type {scaling!r} ({arch}.rope.scaling.type)")
  if "rope_freqs.weight" in g.tensors:
    raise LoadError(f"{src}: unsupported rope type: tensor 'rope_freqs.weight' (per-frequency "
                    "RoPE factors) is not supported")
  tokens = m.get("tokenizer.ggml.tokens") or []
  return ModelConfig(
      arch=arch, vocab_size=int(get("vocab_size", len(tokens) or None)), hidden_size=D,
      intermediate_size=int(get("feed_forward_length")), num_layers=int(get("block_count")),
      num_heads=H, num_kv_heads=int(get("attention.head_count_kv", H)), head_dim=head_dim,
      rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
      rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=rope_scaling,
      max_position_embeddings=int(get("context_length", 2048)),
      tie_word_embeddings="output.weight" not in g.tensors, qkv_bias=arch == "qwen2",
      qk_norm=arch == "qwen3", bos_token_id=m.get("tokenizer.ggml.bos_token_id"),
      eos_token_id=m.get("tokenizer.ggml.eos_token_id"),
      pad_token_id=m.get("tokenizer.ggml.padding_token_id"))


def read_gguf_checkpoint(path: str):
  """(ModelConfig, read(name, kind, shape) -> np.ndarray, Tokenizer) for a .gguf file."""
  from rlpt.models.checkpoint_tensors import (GLOBAL_TENSORS, LAYER_TENSORS, LoadError,
                                              check_tensor, unpermute_rope_rows)
  from rlpt.models.tokenizer import Tokenizer
  try:
    g = GGUFFile(path)
  except GGUFError as e:
    raise LoadError(str(e)) from e
  cfg = config_from_gguf(g)
  tok = Tokenizer.from_gguf_metadata(g.metadata, source=path)

  def read(key: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    name, _, layer = key.partition(":")
    table = LAYER_TENSORS if layer else GLOBAL_TENSORS
    tname = table[name][1].format(i=layer)
    if tname not in g.tensors:
      raise LoadError(f"{path}: tensor {tname!r} is missing")
    if tuple(g.tensors[tname].shape) != tuple(shape):
      raise LoadError(f"{path}: tensor {tname!r} has shape {g.tensors[tname].shape}, "
                      f"expected {tuple(shape)}")
    a = g.read(tname)
    if cfg.arch == "llama" and name in ("wq", "bq"):
      a = unpermute_rope_rows(a, cfg.num_heads)
    elif cfg.arch == "llama" and name in ("wk", "bk"):
      a = unpermute_rope_rows(a, cfg.num_kv_heads)
    return check_tensor(a, shape, path, tname)

  return cfg, read, tok
