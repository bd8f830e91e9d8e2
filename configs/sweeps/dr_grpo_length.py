"""Dr.GRPO's length bias (Liu et al. 2025, sec. 3.1-3.2, fig. 5).

GRPO divides each response's summed token losses by its own length and the group's
advantages by their standard deviation; the paper shows the first lets wrong answers
grow long (a long wrong answer is penalised less per token) and proposes Dr.GRPO
(advantages not std-scaled, token losses summed over a constant). The quantity is the
length of incorrect responses over training. No KL term in either arm, so the two
differ only in those two normalisations.
"""

import ml_collections


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(
      base="configs/ablation.py",
      seeds=(0, 1, 2),
      common={"rl": {"kl_coef": 0.0}},
      arms=(
          ("grpo", {"rl.advantage": "group_norm", "rl.loss_agg": "seq_mean_token_mean"}),
          ("dr_grpo", {"rl.advantage": "group_mean", "rl.loss_agg": "constant"}),
      ),
  ))
