"""GRPO (Shao et al. 2024, DeepSeekMath, sec. 4.1): group-normalized outcome advantages,
PPO clip eps = 0.2, per-sequence mean of token losses, KL to the reference in the loss
with the unbiased k3 estimator and beta = 0.04."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "grpo"
  c.rl.advantage = "group_norm"        # (R - mean_g) / std_g
  c.rl.policy_loss = "ppo_clip"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.loss_agg = "seq_mean_token_mean"  # 1/G sum_i 1/|o_i| sum_t (eq. 3)
  c.rl.kl_coef = 0.04                  # beta in the paper's experiments
  c.rl.kl_estimator = "k3"             # eq. 4: pi_ref/pi - log(pi_ref/pi) - 1
  c.rl.kl_in = "loss"
  return c
