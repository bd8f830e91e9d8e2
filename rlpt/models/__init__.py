"""Policy models: the NNX decoder (Llama, Qwen2, Qwen3), its KV cache, loaders, tokenizer."""

from rlpt.models.decoder import Decoder, KVCache, ModelConfig, forward, init_cache
from rlpt.models.logprobs import token_logprobs

__all__ = ["Decoder", "KVCache", "ModelConfig", "forward", "init_cache", "token_logprobs"]
