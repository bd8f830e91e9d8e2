"""Advantage estimators at the same budget: GRPO, RLOO, REINFORCE++.

Each arm is its paper's preset (rlpt.algorithms.presets) with the KL term removed, so
the estimator (and the loss aggregation its paper pairs it with) is what differs;
prompts, samples, steps and learning rate are the same. REINFORCE++ (Hu 2025) reports
training as stable as GRPO's without a per-prompt baseline; RLOO (Ahmadian et al.
2024) reports the leave-one-out baseline matching or beating PPO-style methods.
"""

import ml_collections

from rlpt.algorithms import presets

_T = 8   # configs/ablation.py's rollout.max_new_tokens


def _arm(name):
  return name, dict(presets.get(name, max_new_tokens=_T), kl_coef=0.0, kl_in="loss")


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(
      base="configs/ablation.py",
      seeds=(0, 1, 2),
      arms=tuple((n, {"rl": o}) for n, o in (_arm("grpo"), _arm("rloo"),
                                              _arm("reinforce_pp"))),
  ))
