"""Policy models: the NNX decoder (Llama, Qwen2, Qwen3), its KV cache, loaders, tokenizer.

Public: `load_model(path, *, dtype="float32", mesh=None) -> (Decoder, Tokenizer)`,
`token_logprobs(model, tokens, loss_mask)`, `save_hf(model, tokenizer, dir)`,
`init_cache(config, batch, max_len, dtype)` and the `Decoder` / `ModelConfig` /
`KVCache` of `rlpt.models.decoder`.
"""

from rlpt.models.decoder import Decoder, KVCache, ModelConfig, forward, init_cache
from rlpt.models.hf_checkpoint import save_hf
from rlpt.models.checkpoint_tensors import LoadError
from rlpt.models.loading import build_model, load_model, random_model
from rlpt.models.logprobs import token_logprobs
from rlpt.models.sharding import LOGICAL_RULES, cache_shardings, make_mesh, param_shardings
from rlpt.models.tokenizer import Tokenizer

__all__ = ["Decoder", "KVCache", "LOGICAL_RULES", "LoadError", "ModelConfig", "Tokenizer",
           "build_model", "cache_shardings", "forward", "init_cache", "load_model", "make_mesh",
           "param_shardings", "random_model", "save_hf", "token_logprobs"]
