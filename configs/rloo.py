"""RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs"): REINFORCE with the
leave-one-out mean of the other k-1 samples as baseline, the whole response as one
action (sequence-level: token log-probs summed), KL to the reference folded into the
reward (k1, beta = 0.05 as in TRL's RLOO default). One update per batch keeps the
ratio at 1, so the clipped surrogate reduces to plain REINFORCE."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.algorithm = "rloo"
  c.rl.advantage = "rloo"
  c.rl.policy_loss = "ppo_clip"
  c.rl.loss_agg = "seq_mean_token_sum"   # -A * sum_t log pi(y_t), mean over samples
  c.rl.kl_coef = 0.05
  c.rl.kl_estimator = "k1"
  c.rl.kl_in = "reward"
  return c
