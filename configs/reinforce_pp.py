"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning
Large Language Models"): no critic and no per-prompt baseline; token-level KL penalty
in the reward (k1, beta = 0.01 as in OpenRLHF's examples), returns summed to the end
(gamma = 1) and normalized over the whole batch; PPO clip 0.2, token-mean loss."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "reinforce_pp"
  c.rl.advantage = "reinforce_pp"
  c.rl.gamma = 1.0
  c.rl.policy_loss = "ppo_clip"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.loss_agg = "token_mean"
  c.rl.kl_coef = 0.01
  c.rl.kl_estimator = "k1"
  c.rl.kl_in = "reward"
  return c
