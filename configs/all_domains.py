"""Every registered domain at once: SmolLM2-135M-Instruct on each task source rlpt has
(every reasoning-gym generator, math, code, extraction, geometry), weights equal, each
domain drawn once in the first steps (110 domains / 8 prompts: 14 steps), then the
mixer's learnability curriculum (domains the policy always or never solves are drawn
less), a 16-task holdout per domain of which 12 domains are evaluated every 10 steps in
rotation (all of them at step 0 and at the end, so evaluation cost stays bounded), and
the forgetting guard: a domain whose holdout accuracy falls 10 points below its best is
flagged (`forgetting/<domain>` in the metrics, the progress bar) and drawn twice as
often until it recovers. Sized as a short CPU run; per-domain curves are in
TensorBoard (eval/accuracy/<domain>, reward_mean/<domain>, mixer/prob/<domain>).
"""

import ml_collections

from configs import common
from rlpt.data import sources


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "smollm2-135m-instruct"
  c.total_steps = 40
  c.data.domains = ml_collections.ConfigDict({d: 1.0 for d in sources.domains()})
  c.data.curriculum = "learnability"
  c.data.cover_domains_first = True
  c.data.forgetting_margin = 0.1
  c.data.forgetting_boost = 2.0
  c.data.prompts_per_step = 8
  c.data.holdout_per_domain = 16
  c.rollout.n = 8
  c.rollout.max_new_tokens = 64
  # 2048 fits every prompt of most domains (rg/arc_agi, rg/rearc and rg/codeio have
  # longer ones, extraction's reports are 2.5k-68k tokens: not CPU-sized). Longer prompts
  # are dead-lettered in training and left out of the holdout (logged).
  c.rollout.max_prompt_len = 2048
  c.rollout.kv_cache_mb = 2048
  c.rl.update(dict(advantage="group_norm", policy_loss="ppo_clip", loss_agg="constant",
                   kl_coef=0.0, lr=2e-5, dynamic_sampling=True, max_refill_rounds=2,
                   microbatch_size=8, length_multiple=32))
  c.sft.steps = 20
  c.sft.batch_size = 8
  c.sft.lr = 5e-5
  c.sft.max_len = 512
  c.eval.every = 10
  c.eval.domains_per_eval = 12
  c.eval.base_tasks = 0
  c.checkpoint.every = 10
  return c
