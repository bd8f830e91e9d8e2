"""A small random decoder with SmolLM2's real tokenizer, for JaxEngine tests: every
generated token can be checked against a cache-free forward of the model itself."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlpt.models import decoder, gguf_file, loading
from rlpt.rollout import JaxEngine, JaxEngineConfig

CFG = decoder.ModelConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=16, eos_token_id=2)


def smollm2_tokenizer():
  _, _, tokenizer = gguf_file.read_gguf_checkpoint(loading.resolve_path("smollm2-135m-instruct"))
  return tokenizer


def tiny(seed):
  """A random decoder whose outputs depend on the whole prompt: weights at
  1/sqrt(fan-in) scale (the default 0.02 init makes greedy repeat the last token)."""
  m = loading.random_model(CFG, seed=seed)
  state = nnx.state(m, nnx.Param)
  def scale(path, x):
    name = str(path[-1])
    if "norm" in name:
      return x
    if "embed" in name:
      return x * 25.0
    return x / 0.02 / np.sqrt(CFG.hidden_size if "down" not in name else CFG.intermediate_size)
  nnx.update(m, jax.tree_util.tree_map_with_path(lambda p, x: scale(p, x), state))
  return m


def engine(model, tok, **kw):
  kw.setdefault("max_batch", 8)
  kw.setdefault("min_prompt_bucket", 32)
  kw.setdefault("length_multiple", 32)
  return JaxEngine(model, tok, JaxEngineConfig(**kw))


def prompts(k, lo=3, hi=30, seed=0):
  rng = np.random.default_rng(seed)
  return [tuple(int(t) for t in rng.integers(10, 40000, size=int(rng.integers(lo, hi))))
          for _ in range(k)]


@jax.jit
def forward_logsoftmax(params, seq):
  return jax.nn.log_softmax(decoder.forward(CFG, params, seq)[0], axis=-1)


def full_logprobs(model, c):
  """log-softmax of a cache-free forward at each completion position, [C, V]
  (right-padded to 96 tokens: causal attention leaves earlier positions alone)."""
  ids = list(c.prompt_ids) + list(c.token_ids)
  seq = jnp.asarray([ids + [0] * (96 - len(ids))], jnp.int32)
  p = len(c.prompt_ids)
  return np.asarray(forward_logsoftmax(model.arrays(), seq))[p - 1:p - 1 + len(c.token_ids)]


def logprob_tol(lp):
  """Engine vs full-forward logprob tolerance. The two paths sum in different orders,
  so the gap grows with the logits' size: this random model's log-softmax spans
  ~60 nats, giving ~1.2e-4 here (tests/rollout/test_jax_engine_smollm2.py holds the
  issue's flat 1e-4 on the real model)."""
  return max(1e-4, 4e-6 * float(np.abs(lp).max()))
