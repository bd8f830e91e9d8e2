"""RL algorithm pieces, registered by name and chosen from `config.rl`.

- advantages: ADVANTAGES {group_norm, group_mean, rloo, reinforce_pp, gae}
- losses: POLICY_LOSSES {ppo_clip, dual_clip, gspo}; LOSS_AGGS {token_mean,
  seq_mean_token_mean, seq_mean_token_sum, constant}; entropy, value loss
- kl: KL_ESTIMATORS {k1, k2, k3}; KL in the loss or in the reward
- dapo: dynamic sampling (DynamicSampler) and overlong reward shaping
- off_policy: OFF_POLICY {none, decoupled_ppo, tis}, behaviour importance weights
- spec: AlgoSpec, the checked config choices

Presets (`presets.get(name, max_new_tokens=...)`: grpo, dr_grpo, dapo, rloo,
reinforce_pp, ppo, gspo) are the config.rl fields each paper uses; configs/NAME.py
applies them.
"""

from rlpt.algorithms.advantages import (ADVANTAGES, compute_advantages, discounted_returns,
                                        outcome_token_rewards, sequence_returns)
from rlpt.algorithms.dapo import DynamicSampler, nonzero_variance_groups, overlong_penalty
from rlpt.algorithms.kl import KL_ESTIMATORS, kl_estimate, penalize_rewards
from rlpt.algorithms.losses import (LOSS_AGGS, POLICY_LOSSES, aggregate,
                                    entropy_from_logits, logprobs_from_logits, loss_weights,
                                    policy_loss, value_loss)
from rlpt.algorithms.registry import Registry
from rlpt.algorithms.spec import AlgoSpec

__all__ = [
    "ADVANTAGES", "AlgoSpec", "DynamicSampler", "KL_ESTIMATORS", "LOSS_AGGS",
    "POLICY_LOSSES", "Registry", "aggregate", "compute_advantages", "discounted_returns",
    "entropy_from_logits", "kl_estimate", "logprobs_from_logits", "loss_weights",
    "nonzero_variance_groups", "outcome_token_rewards", "overlong_penalty",
    "penalize_rewards", "policy_loss", "sequence_returns", "value_loss",
]
