"""The rloo preset (rlpt.algorithms.presets, which cites the paper) on the base config."""

from configs import common
from rlpt.algorithms import presets


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.rl.update(presets.get("rloo", max_new_tokens=c.rollout.max_new_tokens))
  return c
