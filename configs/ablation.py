"""The CPU-scale base of the paper-ablation sweeps (configs/sweeps/): a tiny random
model learns the synthetic copy task from scratch by RL, in about 1.5 minutes a run.

`configs/ablation.py:NAME` applies algorithm preset NAME (rlpt.algorithms.presets).
Two-digit prompts ("47=" -> "47") with room for 8 new tokens: a right answer is 3
tokens (two digits, then EOS), and a policy may write past it until the budget, so
response length (of correct and of incorrect answers) is free to drift as the
length-bias ablations need. 16 of the 100 prompts are held out (never trained on),
evaluated every 100 steps. 300 steps of 16 prompts x 8 samples take GRPO's training
reward from 0.03 to 0.23 (exact answers 0 -> ~20 %; a wrong answer earns 0.5 x the
fraction of its digits in place). Learning rate and sizes are those the smoke run learns
with; every arm of a sweep shares them.
"""

import ml_collections

from configs import common
from rlpt.algorithms import presets


def get_config(arg=None):
  c = common.base_config()
  c.model.name = "tiny"
  c.model.tiny = ml_collections.ConfigDict(
      dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128))
  c.total_steps = 300
  c.rollout.n = 8
  c.rollout.max_new_tokens = 8
  c.rollout.kv_cache_mb = 64
  c.rollout.max_prompt_len = 64
  c.rollout.min_prompt_bucket = 16
  c.rollout.length_multiple = 16
  c.data.domains = ml_collections.ConfigDict({"synthetic": 1.0})
  c.data.prompts_per_step = 16
  c.data.synthetic_length = 2
  c.data.holdout_per_domain = 16
  if arg:
    c.rl.update(presets.get(arg, max_new_tokens=c.rollout.max_new_tokens))
  c.rl.lr = 3e-3
  c.rl.microbatch_size = 128
  c.rl.length_multiple = 16
  c.sft.length_multiple = 16
  c.eval.every = 100
  c.checkpoint.every = 100
  return c
