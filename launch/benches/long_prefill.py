r"""A long prompt through the JaxEngine: blockwise prefill, greedy continuation, memory.

  python -m launch.bench long_prefill [--json=FILE] [--tokens=32768] [--new_tokens=8]
                                      [--chunk=1024] [--model=smollm2-135m-instruct]

rlpt: `JaxEngine.generate` of one greedy sample on a `tokens`-token prompt (a long
document of reasoning-gym questions, then one last question), whose prefill is one
cache-free pass that attends in tiles (ModelConfig.blockwise_from: no [T, T] scores),
with a KV cache sized from the request (prompt + new tokens).

Baseline (`chunked_cached`): an independent path to the same continuation, the prompt
fed through the decoder's cached forward `chunk` tokens at a time (each chunk attends
to the cache plus itself: [chunk, S] scores), then one cached step per new token. The
continuations must be identical (the bench fails otherwise); a full cache-free forward
over prompt + continuation agreed with both at 4608 tokens (top-1 margins >= 0.38).

Memory: the process's peak resident set (VmHWM, reset before each side) over the
resident set before it (the model and the process), and the compile-time temporaries
of the prefill beside the dense [T, T] prefill's (compiled, never run: it would not
fit here at 32k).
"""

from __future__ import annotations

import argparse
import time

from launch.benches import common

BASELINE_NAME = "chunked_cached"
GIB = 2 ** 30


def _rss_gib(field: str) -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024 / GIB
  raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
  with open("/proc/self/clear_refs", "w") as f:   # 5: reset the peak resident set
    f.write("5")


def long_prompt(tokenizer, tokens: int, seed: int = 0) -> list[int]:
  """Exactly `tokens` ids: reasoning-gym questions one after another (the document),
  ending with a question whose answer the continuation starts."""
  import reasoning_gym
  last = tokenizer.encode("\nQuestion: what is 17 + 25? Answer:")
  ids, i = [], 0
  data = list(reasoning_gym.create_dataset("basic_arithmetic", size=512, seed=seed))
  while len(ids) < tokens - len(last):
    ids += tokenizer.encode(f"Q{i}: {data[i % len(data)]['question']}\n")
    i += 1
  return ids[:tokens - len(last)] + list(last)


def chunked_greedy(model, prompt: list[int], new_tokens: int, chunk: int) -> list[int]:
  """The baseline: cached forwards over `chunk`-token pieces (the last one shorter, not
  padded: the cache stays one contiguous run of valid slots), then greedy steps."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from rlpt.models import decoder
  cfg, params = model.config, model.arrays()
  S = -(-(len(prompt) + new_tokens) // 64) * 64
  cache = decoder.init_cache(cfg, 1, S)
  fwd = jax.jit(lambda p, t, c: decoder.forward(cfg, p, t, cache=c), donate_argnums=(2,))
  logits = None
  for lo in range(0, len(prompt), chunk):
    logits, cache = fwd(params, jnp.asarray([prompt[lo:lo + chunk]], jnp.int32), cache)
  out = [int(np.argmax(np.asarray(logits[0, -1])))]
  for _ in range(new_tokens - 1):
    logits, cache = fwd(params, jnp.asarray([[out[-1]]], jnp.int32), cache)
    out.append(int(np.argmax(np.asarray(logits[0, -1]))))
  return out


def prefill_temp_gib(model, T: int, blockwise: bool) -> float:
  """Compile-time temporaries of the engine's prefill pass (return_kv, no logits) of
  one T-token row, blockwise or dense."""
  import jax
  import jax.numpy as jnp
  from rlpt.models import decoder
  cfg = model.config.replace(blockwise_from=model.config.blockwise_from if blockwise else 0)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), model.arrays())
  ids = jax.ShapeDtypeStruct((1, T), jnp.int32)
  fn = jax.jit(lambda p, t, s: decoder.forward(cfg, p, t, positions=s, segment_ids=jnp.ones_like(t),
                                               return_hidden=True, return_kv=True))
  compiled = fn.lower(abstract, ids, ids).compile()
  return compiled.memory_analysis().temp_size_in_bytes / GIB


def run(argv: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench long_prefill")
  p.add_argument("--tokens", type=int, default=32768)
  p.add_argument("--new_tokens", type=int, default=8)
  p.add_argument("--chunk", type=int, default=1024)
  p.add_argument("--model", default="smollm2-135m-instruct")
  a = p.parse_args(argv)
  from rlpt.models import load_model
  from rlpt.rollout.engine import GenerateRequest, SamplingParams
  from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig

  model, tok = load_model(a.model)
  if a.tokens + a.new_tokens > model.config.max_position_embeddings:
    # a mechanics check past the model's trained context (SmolLM2-135M: 8192): both
    # sides compute the same function of the same RoPE positions
    model.config = model.config.replace(max_position_embeddings=a.tokens + a.new_tokens)
  cfg = model.config
  prompt = long_prompt(tok, a.tokens)
  max_len = -(-(a.tokens + a.new_tokens) // 64) * 64
  kv_mib = 2 * cfg.num_layers * max_len * cfg.num_kv_heads * cfg.head_dim * 4 / 2 ** 20
  engine = JaxEngine(model, tok, JaxEngineConfig(max_batch=1, max_len=max_len,
                                                 kv_cache_mib=int(kv_mib) + 64))
  req = GenerateRequest(prompt_ids=tuple(prompt), sampling=SamplingParams(
      temperature=0.0, max_new_tokens=a.new_tokens, ignore_eos=True))
  base_rss = _rss_gib("VmRSS")
  _reset_peak()
  t0 = time.perf_counter()
  got = engine.generate([req])[0].token_ids
  t_rlpt = time.perf_counter() - t0
  peak_rlpt = _rss_gib("VmHWM") - base_rss
  del engine

  base_rss = _rss_gib("VmRSS")
  _reset_peak()
  t0 = time.perf_counter()
  want = chunked_greedy(model, prompt, a.new_tokens, a.chunk)
  t_base = time.perf_counter() - t0
  peak_base = _rss_gib("VmHWM") - base_rss
  same = list(got) == list(want)
  text = tok.decode(list(got))
  if not same:
    raise SystemExit(f"long_prefill: continuations differ: rlpt {list(got)} vs "
                     f"chunked {list(want)}")
  blk, dense = prefill_temp_gib(model, a.tokens, True), prefill_temp_gib(model, a.tokens, False)
  note = f"T={a.tokens}, {a.new_tokens} greedy tokens identical ({text!r})"
  return [
      common.Row(f"wall s T={a.tokens}", t_rlpt, t_base, "s", higher_is_better=False,
                 note=note + "; compile included on both sides"),
      common.Row(f"peak RSS over start T={a.tokens}", peak_rlpt, peak_base, "GiB",
                 higher_is_better=False, note="VmHWM - VmRSS before; KV cache "
                 f"{kv_mib / 1024:.2f} GiB"),
      common.Row(f"prefill temporaries T={a.tokens}", blk, dense, "GiB", higher_is_better=False,
                 note="compiled: blockwise vs the dense [T, T] prefill (baseline column)"),
  ]
