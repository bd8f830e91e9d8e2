"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale"): clip-higher (eps_low = 0.2, eps_high = 0.28), dynamic sampling (drop groups
whose rewards are all equal, refill), token-level loss over the whole batch, overlong
reward shaping (a soft penalty in the last L_cache tokens: 4096 of 20480 in the
paper, the last 20 % of the budget here), and no KL term."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "dapo"
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "ppo_clip"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.28            # clip-higher
  c.rl.loss_agg = "token_mean"         # token-level policy gradient loss
  c.rl.kl_coef = 0.0                   # KL term removed
  c.rl.dynamic_sampling = True
  c.rl.max_refill_rounds = 3
  c.rl.overlong_buffer = max(1, c.rollout.max_new_tokens // 5)
  c.rl.overlong_penalty = 1.0
  return c
