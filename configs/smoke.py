"""A tiny model on a synthetic verifiable task: trains in under a minute on CPU."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "tiny"
  c.total_steps = 20
  c.rollout.n = 4
  c.rollout.max_new_tokens = 8
  c.data.domains = {"synthetic": 1.0}
  c.data.prompts_per_step = 8
  c.rl.lr = 1e-3
  return c
