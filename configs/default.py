"""The default experiment (`make run`): SmolLM2-135M-Instruct on CPU, a short SFT on
the answer format, then GRPO on a mix of easy reasoning-gym domains and math."""

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "smollm2-135m-instruct"
  c.total_steps = 40
  c.data.domains = {"math": 1.0, "rg/basic_arithmetic": 1.0, "rg/chain_sum": 1.0}
  c.rl.algorithm = "grpo"
  c.rl.lr = 1e-6
  return c
