"""Rollout engines: the interface, the embedded JaxEngine, SGLang client and fleet."""

from rlpt.rollout.engine import (Completion, GenerateRequest, RolloutEngine, SamplingParams,
                                 WeightUpdateStats)
from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig

__all__ = ["Completion", "GenerateRequest", "JaxEngine", "JaxEngineConfig", "RolloutEngine",
           "SamplingParams", "WeightUpdateStats"]
