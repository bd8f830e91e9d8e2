"""Rollout engines: the interface, the embedded JaxEngine, SGLang client and fleet."""

from rlpt.rollout.engine import (Completion, GenerateRequest, RolloutEngine, SamplingParams,
                                 WeightUpdateStats)
from rlpt.rollout.client import SGLangClient
from rlpt.rollout.fleet import Fleet
from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig

__all__ = ["Completion", "Fleet", "GenerateRequest", "JaxEngine", "JaxEngineConfig",
           "RolloutEngine", "SGLangClient", "SamplingParams", "WeightUpdateStats"]
