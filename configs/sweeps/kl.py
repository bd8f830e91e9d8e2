"""The KL term: none, k1 in the reward, k3 in the loss (GRPO's placement).

GRPO (Shao et al. 2024) puts the unbiased k3 estimator of KL(pi || ref) in the loss;
PPO-style RLHF (Ouyang et al. 2022) and REINFORCE++ subtract k1 per token from the
reward. Either keeps the policy near the reference at some cost in reward. Same
coefficient (GRPO's 0.04) in both placements.
"""

import ml_collections


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(
      base="configs/ablation.py:grpo",
      seeds=(0, 1, 2),
      arms=(
          ("none", {"rl.kl_coef": 0.0}),
          ("k1_reward", {"rl.kl_coef": 0.04, "rl.kl_estimator": "k1", "rl.kl_in": "reward"}),
          ("k3_loss", {"rl.kl_coef": 0.04, "rl.kl_estimator": "k3", "rl.kl_in": "loss"}),
      ),
  ))
