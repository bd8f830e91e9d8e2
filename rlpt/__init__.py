"""rlpt: JAX-native reinforcement-learning post-training of language models (RLVR).

Subpackages (imports point down this list, never up):
  rlpt.train -> rlpt.algorithms, rlpt.data, rlpt.rollout, rlpt.rewards
             -> rlpt.models, rlpt.sandbox -> rlpt.ops, rlpt.types
"""

__version__ = "0.1.0"
