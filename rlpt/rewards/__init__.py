"""Rewards: the domain -> verifier registry, `compute_reward`, penalties, verifiers.

  from rlpt import rewards
  r = rewards.compute_reward(task, completion)      # RewardResult
  rs = rewards.compute_rewards(tasks, completions)  # batched, parallel, per-sample timeouts

Built-in domains: "math", "code", "extraction", "geometry" and "rg/<generator>"
for every reasoning-gym generator.
"""

from rlpt.rewards.registry import (VERIFIER_REGISTRY, VIOLATIONS, FunctionVerifier, RewardConfig,
                                   Verifier, compute_reward, compute_rewards, configure,
                                   get_config, get_verifier, register)


def _register_builtins() -> None:
  from rlpt.rewards import code_verifier, extraction, geometry, math_verifier, rg
  register("math", math_verifier.MathVerifier())
  register("code", code_verifier.CodeVerifier())
  register("geometry", geometry.GeometryVerifier())
  register("extraction", extraction.ExtractionVerifier())
  for name in rg.generators():
    register(f"rg/{name}", rg.RGVerifier(name))


_register_builtins()

__all__ = ["VERIFIER_REGISTRY", "VIOLATIONS", "FunctionVerifier", "RewardConfig", "Verifier",
           "compute_reward", "compute_rewards", "configure", "get_config", "get_verifier",
           "register"]
