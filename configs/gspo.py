"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): group-normalized
advantages with a sequence-level importance ratio (the length-normalized likelihood
ratio), clipped at sequence level with eps_low = 3e-4 and eps_high = 4e-4 (sec. 5.1),
averaged per sequence; no KL term."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "gspo"
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "gspo"
  c.rl.clip_eps_low = 3e-4
  c.rl.clip_eps_high = 4e-4
  c.rl.loss_agg = "seq_mean_token_mean"
  c.rl.kl_coef = 0.0
  return c
