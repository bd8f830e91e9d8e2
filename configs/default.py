"""The default experiment (`make run`): SmolLM2-135M-Instruct on CPU, a short SFT on
the answer format, then GRPO on a mix of easy reasoning-gym domains and math.

Sized for the 2-core CPU machine (<= 30 minutes), where a forward+backward pass of
the 135M model runs at roughly 100-150 tokens/s: 30 SFT steps of 8 demonstrations,
then 30 GRPO steps of 4 prompts x 8 samples with 32 new tokens (answers go in
<answer></answer> tags or \boxed{}, which SFT teaches). The "math" domain uses the
reasoning-gym generators with short prompts (the word problems of gsm_symbolic would
double every batch's length). Holdout accuracy per domain (64 tasks each, greedy) is
measured on the base model, after SFT and after RL, and printed as a table at the end
(also in WORKDIR/evals.json).
"""

import ml_collections

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "smollm2-135m-instruct"
  c.total_steps = 30
  c.data.domains = ml_collections.ConfigDict(
      {"math": 1.0, "rg/basic_arithmetic": 1.0, "rg/chain_sum": 1.0})
  c.data.prompts_per_step = 4
  c.data.math_generators = "basic_arithmetic,chain_sum,lcm,simple_equations"
  c.data.holdout_per_domain = 64
  c.rollout.n = 8
  c.rollout.max_new_tokens = 32
  c.rollout.kv_cache_mb = 1024
  c.rl.algorithm = "grpo"
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "ppo_clip"
  c.rl.loss_agg = "seq_mean_token_mean"
  c.rl.kl_coef = 0.0
  c.rl.lr = 2e-5
  c.rl.microbatch_size = 8
  c.sft.steps = 30
  c.sft.batch_size = 8
  c.sft.lr = 5e-5
  c.sft.max_len = 256
  c.eval.every = 0                    # holdout before SFT, after SFT and at the end
  c.checkpoint.every = 10
  return c
