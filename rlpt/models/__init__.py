"""Policy models: the NNX decoder (Llama, Qwen2, Qwen3), its KV cache, loaders, tokenizer."""

from rlpt.models.decoder import Decoder, KVCache, ModelConfig, forward, init_cache
from rlpt.models.layout import LoadError
from rlpt.models.loading import build_model, load_model, random_model
from rlpt.models.logprobs import token_logprobs
from rlpt.models.tokenizer import Tokenizer

__all__ = ["Decoder", "KVCache", "LoadError", "ModelConfig", "Tokenizer", "build_model",
           "forward", "init_cache", "load_model", "random_model", "token_logprobs"]
