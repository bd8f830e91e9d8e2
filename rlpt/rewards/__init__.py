"""Rewards: the domain -> verifier registry, `compute_reward`, penalties, verifiers.

  from rlpt import rewards
  r = rewards.compute_reward(task, completion)      # RewardResult
  rs = rewards.compute_rewards(tasks, completions)  # batched, parallel, per-sample timeouts

Built-in domains: "math", "code", "extraction", "geometry", "python_tool" and
"code_repair" (episodic domains: rlpt.envs) and "rg/<generator>"
for every reasoning-gym generator (their task sources: rlpt.data.sources, the same
names), and "synthetic[/<ops>]", the tiny model's task (rlpt.data.synthetic).
"""

from rlpt.rewards.registry import (VERIFIER_REGISTRY, VIOLATIONS, FunctionVerifier, RewardConfig,
                                   Verifier, compute_reward, compute_rewards, configure,
                                   get_config, get_verifier, has_verifier, register,
                                   register_family, VerifierUnavailable,
                                   verifier_failure)


def _register_builtins() -> None:
  from rlpt.rewards import (arithmetic, code_verifier, extraction, geometry, math_verifier,
                            repair, rg, synthetic)
  register("math", math_verifier.MathVerifier())
  register("code", code_verifier.CodeVerifier())
  register("geometry", geometry.GeometryVerifier())
  register("extraction", extraction.ExtractionVerifier())
  register("python_tool", FunctionVerifier(arithmetic.verify, isolation="inline"))
  register("code_repair", repair.RepairVerifier())
  for name in rg.generators():
    register(f"rg/{name}", rg.RGVerifier(name))
  # The tiny model's task (rlpt.data.synthetic): "synthetic" and "synthetic/<ops>".
  sv = FunctionVerifier(synthetic.verify, isolation="inline")
  register("synthetic", sv)
  register_family("synthetic", sv)


_register_builtins()

__all__ = ["VERIFIER_REGISTRY", "VIOLATIONS", "FunctionVerifier", "RewardConfig", "Verifier",
           "compute_reward", "compute_rewards", "configure", "get_config", "get_verifier",
           "has_verifier", "register", "register_family", "VerifierUnavailable",
           "verifier_failure"]
