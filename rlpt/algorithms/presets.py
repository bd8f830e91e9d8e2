"""Named algorithm presets: the `config.rl` fields each paper's method sets.

    c.rl.update(presets.get("dapo", max_new_tokens=c.rollout.max_new_tokens))

A preset is a dict of `config.rl` field -> value (what `AlgoSpec` and the RL loop
read); fields it leaves out keep the base config's values (learning rate, batch
sizes, ...). `configs/NAME.py` applies preset NAME to the base config, and
`configs/smoke.py:NAME` to the smoke run.

  grpo          Shao et al. 2024 (DeepSeekMath, sec. 4.1): group-normalized outcome
                advantages, PPO clip 0.2, per-sequence mean of token losses, KL to the
                reference in the loss with the unbiased k3 estimator, beta = 0.04.
  dr_grpo       Liu et al. 2025 ("Understanding R1-Zero-Like Training", sec. 3.2): GRPO
                without its two biases: advantages not divided by the group std, token
                losses summed and divided by a constant (the generation budget) instead of
                each response's length; no KL term.
  dapo          Yu et al. 2025 (DAPO): clip-higher (0.2 / 0.28), dynamic sampling (drop
                groups whose rewards are all equal, refill), token-level loss over the
                batch, overlong reward shaping in the last 20 % of the budget (4096 of
                20480 tokens in the paper), no KL term.
  gspo          Zheng et al. 2025 (GSPO): group-normalized advantages with a
                sequence-level, length-normalized importance ratio clipped at 3e-4 / 4e-4
                (sec. 5.1), averaged per sequence; no KL term.
  ppo           Schulman et al. 2017, Ouyang et al. 2022: GAE from a value head
                (gamma 1, lambda 0.95), clipped policy and value losses (0.2), value loss
                weight 0.5, KL to the reference in the reward (k1, 0.02).
  reinforce_pp  Hu 2025 (REINFORCE++): no critic, no per-prompt baseline; token-level KL
                in the reward (k1, beta 0.01 as in OpenRLHF's examples), returns summed to
                the end and normalized over the batch; PPO clip 0.2, token-mean loss.
  rloo          Ahmadian et al. 2024 ("Back to Basics"): REINFORCE with the leave-one-out
                mean of the other k-1 samples as baseline, the response as one action
                (token log-probs summed), KL folded into the reward (k1, 0.05 as in TRL).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

_PRESETS: dict[str, Callable[[int], dict[str, Any]]] = {
    "grpo": lambda T: dict(advantage="group_norm", policy_loss="ppo_clip", clip_eps_low=0.2,
                           clip_eps_high=0.2, loss_agg="seq_mean_token_mean", kl_coef=0.04,
                           kl_estimator="k3", kl_in="loss"),
    "dr_grpo": lambda T: dict(advantage="group_mean", policy_loss="ppo_clip", clip_eps_low=0.2,
                              clip_eps_high=0.2, loss_agg="constant", loss_agg_constant=0,
                              kl_coef=0.0),
    "dapo": lambda T: dict(advantage="group_norm", policy_loss="ppo_clip", clip_eps_low=0.2,
                           clip_eps_high=0.28, loss_agg="token_mean", kl_coef=0.0,
                           dynamic_sampling=True, max_refill_rounds=3,
                           overlong_buffer=max(1, T // 5), overlong_penalty=1.0),
    "gspo": lambda T: dict(advantage="group_norm", policy_loss="gspo", clip_eps_low=3e-4,
                           clip_eps_high=4e-4, loss_agg="seq_mean_token_mean", kl_coef=0.0),
    "ppo": lambda T: dict(advantage="gae", gamma=1.0, gae_lambda=0.95, policy_loss="ppo_clip",
                          clip_eps_low=0.2, clip_eps_high=0.2, loss_agg="token_mean",
                          value_coef=0.5, value_clip=0.2, kl_coef=0.02, kl_estimator="k1",
                          kl_in="reward"),
    "reinforce_pp": lambda T: dict(advantage="reinforce_pp", gamma=1.0, policy_loss="ppo_clip",
                                   clip_eps_low=0.2, clip_eps_high=0.2, loss_agg="token_mean",
                                   kl_coef=0.01, kl_estimator="k1", kl_in="reward"),
    "rloo": lambda T: dict(advantage="rloo", policy_loss="ppo_clip",
                           loss_agg="seq_mean_token_sum", kl_coef=0.05, kl_estimator="k1",
                           kl_in="reward"),
}


def names() -> list[str]:
  return sorted(_PRESETS)


def get(name: str, *, max_new_tokens: int) -> dict[str, Any]:
  """The `config.rl` fields of preset `name` for a generation budget of
  `max_new_tokens` (DAPO's overlong window is a fraction of it)."""
  if name not in _PRESETS:
    near = difflib.get_close_matches(name, list(_PRESETS), n=1)
    raise ValueError(f"unknown algorithm preset {name!r}"
                     + (f"; did you mean {near[0]!r}?" if near else "")
                     + f" (presets: {', '.join(names())})")
  return _PRESETS[name](int(max_new_tokens))
