"""A tiny model on a synthetic verifiable task: trains in under a minute on CPU.

`configs/smoke.py:NAME` applies the algorithm preset NAME (rlpt.algorithms.presets:
grpo, dr_grpo, dapo, ...) and keeps the smoke run's sizes and learning rate.
"""

import ml_collections

from configs import common
from rlpt.algorithms import presets


def get_config(arg=None):
  c = common.base_config()
  c.model.name = "tiny"
  c.model.tiny = ml_collections.ConfigDict(
      dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128))
  c.total_steps = 60
  c.rollout.n = 8
  c.rollout.max_new_tokens = 2       # the answer digit, then EOS
  c.rollout.kv_cache_mb = 64
  c.rollout.max_prompt_len = 64      # prompts are a few characters
  c.rollout.min_prompt_bucket = 16
  c.rollout.length_multiple = 16
  c.data.domains = ml_collections.ConfigDict({"synthetic": 1.0})
  c.data.prompts_per_step = 16
  # No holdout by default: with 1-digit prompts the held-out digits are never
  # trained on (see rlpt.data.synthetic), and evals cost compile time.
  c.data.holdout_per_domain = 0
  c.data.synthetic_length = 1        # digits per synthetic prompt
  if arg:
    c.rl.update(presets.get(arg, max_new_tokens=c.rollout.max_new_tokens))
  c.rl.lr = 3e-3
  c.rl.kl_coef = 0.0
  c.rl.microbatch_size = 128
  # A 2-token budget leaves no room for DAPO's soft overlong window.
  c.rl.overlong_buffer = 0
  c.rl.length_multiple = 16          # sequences are a few tokens long
  c.sft.length_multiple = 16
  c.eval.every = 30
  c.checkpoint.every = 10
  return c
