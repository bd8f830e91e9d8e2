"""`AlgoSpec`: the algorithm choices of `config.rl`, checked and resolved once.

    spec = AlgoSpec.from_config(config.rl, max_new_tokens=config.rollout.max_new_tokens)

Raises ValueError naming the config field and the registered choices for an unknown
name or an impossible value, so a bad config fails before any model is loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlpt.algorithms import advantages as adv_lib
from rlpt.algorithms import kl as kl_lib
from rlpt.algorithms import losses as loss_lib
from rlpt.algorithms import off_policy as off_policy_lib


@dataclasses.dataclass(frozen=True)
class AlgoSpec:
  """What the learner needs to know about the algorithm (hashable: a jit static arg)."""

  advantage: str = "group_norm"
  policy_loss: str = "ppo_clip"
  loss_agg: str = "token_mean"
  loss_agg_constant: float = 0.0
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  dual_clip_c: float = 3.0
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  kl_in: str = "loss"
  entropy_coef: float = 0.0
  adv_eps: float = 1e-6
  gamma: float = 1.0
  gae_lambda: float = 1.0
  value_coef: float = 0.0
  value_clip: float = 0.2
  off_policy: str = "none"       # rlpt.algorithms.off_policy.OFF_POLICY
  importance_cap: float = 2.0    # its cap on the behaviour importance weight
  # The policy trained is softmax(logits / temperature): the RL loop sets it to
  # rollout.temperature, so the learner scores samples under the distribution that drew them.
  temperature: float = 1.0

  def __post_init__(self):
    def check(field, ok, what):
      if not ok:
        raise ValueError(f"config.rl.{field} = {getattr(self, field)!r}: expected {what}")
    for field, reg in (("advantage", adv_lib.ADVANTAGES),
                       ("policy_loss", loss_lib.POLICY_LOSSES),
                       ("loss_agg", loss_lib.LOSS_AGGS),
                       ("kl_estimator", kl_lib.KL_ESTIMATORS)):
      check(field, getattr(self, field) in reg, f"one of {reg.names()}")
    check("kl_in", self.kl_in in kl_lib.KL_PLACEMENTS, f"one of {list(kl_lib.KL_PLACEMENTS)}")
    check("clip_eps_low", 0 <= self.clip_eps_low < 1, "a value in [0, 1)")
    check("clip_eps_high", self.clip_eps_high >= 0, "a value >= 0")
    check("dual_clip_c", self.dual_clip_c > 1, "a value > 1")
    check("kl_coef", self.kl_coef >= 0, "a value >= 0")
    check("gamma", 0 < self.gamma <= 1, "a value in (0, 1]")
    check("gae_lambda", 0 <= self.gae_lambda <= 1, "a value in [0, 1]")
    check("off_policy", self.off_policy in off_policy_lib.OFF_POLICY,
          f"one of {list(off_policy_lib.OFF_POLICY)}")
    check("importance_cap", self.importance_cap >= 1, "a value >= 1")
    check("temperature", self.temperature > 0, "a value > 0")
    check("loss_agg_constant", self.loss_agg != "constant" or self.loss_agg_constant > 0,
          "a positive normalizer for loss_agg='constant'")

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0

  @property
  def corrects_off_policy(self) -> bool:
    return self.off_policy != "none"

  @property
  def uses_values(self) -> bool:
    return self.advantage == "gae"

  @classmethod
  def from_config(cls, rl: Any, *, max_new_tokens: int | None = None) -> "AlgoSpec":
    """Reads the fields of `config.rl` this class has (absent ones keep defaults).
    loss_agg_constant = 0 means the generation budget `max_new_tokens` (Dr.GRPO)."""
    get = rl.get if hasattr(rl, "get") else (lambda k, d=None: getattr(rl, k, d))
    kw = {}
    for f in dataclasses.fields(cls):
      v = get(f.name, None)
      if v is not None:
        kw[f.name] = type(f.default)(v)
    if kw.get("loss_agg") == "constant" and not kw.get("loss_agg_constant"):
      kw["loss_agg_constant"] = float(max_new_tokens or 0)
    return cls(**kw)
