"""DAPO's components, each removed in turn (Yu et al. 2025, table 1 / sec. 3).

The paper builds DAPO up from naive GRPO on AIME 2024 (Qwen2.5-32B): clip-higher,
dynamic sampling, token-level loss and overlong shaping each add accuracy. Here the
full recipe is the first arm and each later arm removes one component, on the
CPU-scale copy task (configs/ablation.py:dapo).
"""

import ml_collections


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(
      base="configs/ablation.py:dapo",
      seeds=(0, 1, 2),
      arms=(
          ("dapo", {}),
          ("no_clip_higher", {"rl.clip_eps_high": 0.2}),
          ("no_dynamic_sampling", {"rl.dynamic_sampling": False}),
          ("no_token_level_loss", {"rl.loss_agg": "seq_mean_token_mean"}),
          ("no_overlong_shaping", {"rl.overlong_buffer": 0}),
      ),
  ))
