r"""bfloat16 against float32 on SmolLM2-135M: the learner step's time, the engine's decode
speed, and the gap between the logprobs the engine samples with and those the learner
scores the same tokens with (what the importance ratio compares).

  python -m launch.bench bf16 [--json=FILE] [--prompts=16] [--new_tokens=32]
      [--batch=8] [--seq=256] [--microbatch=2] [--iters=3]

rlpt's column is the bf16 run (`load_model(dtype="bfloat16")`: fp32 master weights
and optimizer state, bf16 dot inputs with fp32 sums), the baseline column the fp32
run of the same code. On XLA:CPU bf16 dots of passes that may be differentiated are
emulated (rlpt.models.projections.dot_operand: operands rounded to bf16, products and
sums in fp32), so the CPU's step-time ratio says what the emulation costs here, not
what an accelerator's bf16 units gain; the logprob gaps are the numerics an
accelerator would have, up to the order of fp32 sums.

Gap rows: per completion token, |engine logprob - learner logprob| of one
dtype (each side in that dtype, same weights), max and mean over the tokens the
engine sampled at temperature 1; and "bf16 vs fp32 learner", what bf16 changes in the
learner's logprobs of the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from launch.benches import common

BASELINE_NAME = "fp32"
MODEL = "smollm2-135m-instruct"
TOPICS = ("the sea", "a clock", "bread", "rain", "a bridge", "chess", "winter", "a river")


def _prompts(n):
  return [[{"role": "user", "content": f"Write two sentences about "
             f"{TOPICS[i % len(TOPICS)]}, number {i}."}] for i in range(n)]


def _rows_of(completions, pad_id):
  """Right-padded (with `pad_id`, masked out) tokens [N, T], attention mask, loss mask over the completions and
  the engine's logprobs in the same layout."""
  seqs = [list(c.prompt_ids) + list(c.token_ids) for c in completions]
  t = max(len(s) for s in seqs)
  tokens = np.full((len(seqs), t), pad_id, np.int32)
  attn = np.zeros_like(tokens, bool)
  lm = np.zeros_like(attn)
  elp = np.zeros(tokens.shape, np.float32)
  for i, (s, c) in enumerate(zip(seqs, completions)):
    tokens[i, :len(s)] = s
    attn[i, :len(s)] = True
    p = len(c.prompt_ids)
    lm[i, p:len(s)] = True
    elp[i, p:len(s)] = c.logprobs
  return tokens, attn, lm, elp


def _side(dtype, prompts, new_tokens, b, t, microbatch):
  """(learner step fn, engine decode seconds and tokens, completions, learner, tokenizer)."""
  import jax
  from rlpt.algorithms import AlgoSpec
  from rlpt.models import load_model
  from rlpt.rollout import GenerateRequest, JaxEngine, JaxEngineConfig, SamplingParams
  from rlpt.train.learner import Learner, metrics_to_host
  from rlpt.train.optim import OptimConfig

  model, tok = load_model(MODEL, dtype=dtype)
  engine = JaxEngine(model, tok, JaxEngineConfig(max_batch=len(prompts)))
  sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
  reqs = [GenerateRequest(messages=m, sampling=sp) for m in prompts]
  engine.generate(reqs)                       # compile
  t0 = time.perf_counter()
  out = engine.generate(reqs)
  decode_s = time.perf_counter() - t0
  learner = Learner(model, AlgoSpec(loss_agg="token_mean"), OptimConfig(lr=1e-6),
                    microbatch_size=microbatch)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(learner.state.params)), \
      "master weights must stay fp32"
  del model, engine
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, tok.vocab_size, (b, t)).astype(np.int32)
  loss_mask = np.zeros((b, t), bool)
  loss_mask[:, t // 4:] = True
  attn = np.ones_like(loss_mask)
  old = learner.logprobs(tokens, attn, loss_mask)
  rewards = rng.integers(0, 2, b).astype(np.float32)
  batch = learner.prepare(tokens, attn, loss_mask, old, rewards, group_size=4)
  step = lambda: metrics_to_host(learner.step(batch))  # noqa: E731
  return step, decode_s, out, learner, tok


def run(argv):
  p = argparse.ArgumentParser(prog="launch.bench bf16")
  p.add_argument("--prompts", type=int, default=16)
  p.add_argument("--new_tokens", type=int, default=32)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--microbatch", type=int, default=2)
  p.add_argument("--iters", type=int, default=3)
  a = p.parse_args(argv)
  prompts = _prompts(a.prompts)
  sides = {d: _side(d, prompts, a.new_tokens, a.batch, a.seq, a.microbatch)
           for d in ("float32", "bfloat16")}
  # The gaps first, while every learner still holds the weights its engine sampled with
  # (a learner step moves them and the gap would measure the update, not the numerics).
  gaps, lps = {}, {}
  for d, (_, _, out, learner, _) in sides.items():
    tokens, attn, lm, elp = _rows_of(out, 0)
    llp = learner.logprobs(tokens, attn, lm)
    diff = np.abs(llp - elp)[lm]
    gaps[d] = (float(diff.max()), float(diff.mean()))
    lps[d] = (tokens, attn, lm, llp)
  # the same (bf16-sampled) tokens under the fp32 and the bf16 learner
  tokens, attn, lm, llp16 = lps["bfloat16"]
  llp32 = sides["float32"][3].logprobs(tokens, attn, lm)
  cross = np.abs(llp16 - llp32)[lm]
  n_tok = int(lm.sum())

  for side in sides.values():
    side[0]()                                 # compile + first step, not timed
  times = {d: [] for d in sides}
  for _ in range(a.iters):                    # interleaved rounds
    for d, side in sides.items():
      w0 = time.perf_counter()
      side[0]()
      times[d].append(time.perf_counter() - w0)
  med = {d: statistics.median(v) for d, v in times.items()}
  rng_note = ", ".join(f"{d} {min(v):.2f}-{max(v):.2f} s" for d, v in times.items())

  dec = {d: a.prompts * a.new_tokens / s[1] for d, s in sides.items()}
  return [
      common.Row("learner step (B=%d, T=%d)" % (a.batch, a.seq), med["bfloat16"],
                 med["float32"], "s", higher_is_better=False,
                 note=f"median of {a.iters} interleaved rounds ({rng_note})"),
      common.Row("engine decode", dec["bfloat16"], dec["float32"], "tok/s",
                 note=f"{a.prompts} prompts x {a.new_tokens} new tokens, T=1"),
      common.Row("engine-learner logprob gap, max", gaps["bfloat16"][0], gaps["float32"][0],
                 "nats", higher_is_better=False, note=f"over {n_tok} sampled tokens"),
      common.Row("engine-learner logprob gap, mean", gaps["bfloat16"][1], gaps["float32"][1],
                 "nats", higher_is_better=False),
      common.Row("bf16 vs fp32 learner logprobs, max", float(cross.max()), None, "nats",
                 note="same tokens; mean %.2e" % float(cross.mean())),
  ]
