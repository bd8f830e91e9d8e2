"""Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
Perspective", sec. 3.2): GRPO without its two biases: the advantage is not divided by
the group std, and token losses are summed and divided by a constant (the generation
budget) instead of each response's length. No KL term (beta = 0, as in their runs)."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "dr_grpo"
  c.rl.advantage = "group_mean"        # R - mean_g, no std
  c.rl.policy_loss = "ppo_clip"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.loss_agg = "constant"           # sum_t / C, C = max_new_tokens when 0
  c.rl.loss_agg_constant = 0
  c.rl.kl_coef = 0.0
  return c
