"""Test doubles for episode tests: a scripted engine (the model's turns given as token
ids) and an environment that answers a fixed number of tool results."""

from __future__ import annotations

from rlpt.envs.base import EnvStep, Environment, ToolRecord
from rlpt.rollout.engine import Completion, RolloutEngine


def char_ids(tok, text):
  """`text` as one token per character: a valid sampling the tokenizer never produces."""
  return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


class Scripted(RolloutEngine):
  """Answers each request with the next of `turns` (token ids), ending in EOS."""

  def __init__(self, tok, turns):
    self.tok, self.turns, self.prompts = tok, list(turns), []

  @property
  def weight_version(self):
    return 7

  def generate(self, requests):
    out = []
    for r in requests:
      self.prompts.append(list(r.prompt_ids))
      ids = list(self.turns.pop(0)) + [self.tok.eos_token_id]
      out.append(Completion(str(len(self.prompts)), 0, list(r.prompt_ids), ids,
                            self.tok.decode(ids[:-1]), [-0.5] * len(ids), [-0.5] * len(ids),
                            "stop", 7))
    return out

  def update_weights(self, source, version):
    raise NotImplementedError


class Echo(Environment):
  """Answers `rounds` turns with a tool result, then ends; never runs anything."""

  tools = ("python",)

  def __init__(self, rounds=2, bad_call=False):
    self.rounds, self.bad_call, self.seen = rounds, bad_call, []

  def reset(self, task):
    self.seen = []
    return [{"role": "user", "content": task.prompt}]

  def step(self, text):
    self.seen.append(text)
    if len(self.seen) > self.rounds:
      return EnvStep(done=True)
    rec = ToolRecord("python", {"code": "x"}, f"out {len(self.seen)}",
                     violation="tool_call" if self.bad_call else None)
    return EnvStep(messages=({"role": "tool", "name": "python",
                              "content": f"out {len(self.seen)}"},), records=(rec,))

  def completion(self):
    return self.seen[-1]


