"""Rollout engines: the interface, the embedded JaxEngine, SGLang client and fleet."""

from rlpt.rollout.engine import (Completion, GenerateRequest, RolloutEngine, SamplingParams,
                                 WeightUpdateStats)

__all__ = ["Completion", "GenerateRequest", "RolloutEngine", "SamplingParams", "WeightUpdateStats"]
