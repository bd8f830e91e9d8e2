"""PPO for LLMs (Schulman et al. 2017; Ouyang et al. 2022, InstructGPT): GAE advantages
from a value head (gamma = 1, lambda = 0.95), clipped policy (0.2) and clipped value
(0.2) losses, value loss weight 0.5, KL to the reference in the reward (k1)."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "ppo"
  c.rl.advantage = "gae"
  c.rl.gamma = 1.0
  c.rl.gae_lambda = 0.95
  c.rl.policy_loss = "ppo_clip"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.loss_agg = "token_mean"
  c.rl.value_coef = 0.5
  c.rl.value_clip = 0.2
  c.rl.kl_coef = 0.02
  c.rl.kl_estimator = "k1"
  c.rl.kl_in = "reward"
  return c
