r"""Multi-turn episodes: KV reuse across turns against re-prefilling the history.

  python -m launch.bench multiturn [--json=FILE] [--episodes=8] [--turns=4]
                                   [--max-new=48] [--tool-tokens=60] [--repeats=2]

A batch of `--episodes` SmolLM2 episodes of `--turns` model turns each: after every
turn but the last, an environment answers with a tool result of about
`--tool-tokens` tokens (rendered by the chat template, masked). Both sides run the
same episodes through rlpt.envs.episode.run_episodes on one JaxEngine with the same
seeded sampling, and must produce the same tokens (checked):
  rlpt      kv_reuse=True: each episode's slot continues from its KV cache; only
            the environment's tokens are computed (decode.extend), and an
            environment answers on a worker thread while other slots decode
  baseline  kv_reuse=False: every turn is a new request holding the whole history,
            prefilled again (what an engine without multi-turn support does)
Reported: model tokens/s (sampled tokens, environment tokens excluded), prefill
tokens computed per side, and the wall time per batch; each side's first batch
(compiles) is discarded, then the best of `--repeats`.
"""

from __future__ import annotations

import argparse
import os
import time

from launch.benches import common

BASELINE_NAME = "re-prefill each turn"

TOOL_TEXT = ("Traceback (most recent call last):\n  File \"solution.py\", line {n}, in <module>\n"
             "    assert add(2, 3) == 5, add(2, 3)\nAssertionError: {v}\n")


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench multiturn")
  p.add_argument("--episodes", type=int, default=8)
  p.add_argument("--turns", type=int, default=4)
  p.add_argument("--max-new", type=int, default=48)
  p.add_argument("--tool-tokens", type=int, default=60)
  p.add_argument("--repeats", type=int, default=2)
  a = p.parse_args(args)
  from rlpt.envs import episode as ep_lib  # noqa: PLC0415 -- keeps `launch.bench` cheap
  from rlpt.envs.base import EnvStep, Environment, ToolRecord  # noqa: PLC0415
  from rlpt.models import load_model  # noqa: PLC0415
  from rlpt.rollout import JaxEngine, JaxEngineConfig, SamplingParams  # noqa: PLC0415
  from rlpt.types import Task  # noqa: PLC0415

  model, tok = load_model("smollm2-135m-instruct")
  filler = " ".join(f"line{i}" for i in range(a.tool_tokens))
  # the tool result after turn t (1-based), cut to --tool-tokens tokens: made once,
  # outside the timed batches
  answers = {t: tok.decode(tok.encode(TOOL_TEXT.format(n=t, v=t) + filler,
                                      add_special_tokens=False)[:a.tool_tokens])
             for t in range(1, a.turns)}

  class ToolLoop(Environment):
    """Answers every turn but the last with a fixed-size tool result."""
    tools = ("run",)

    def __init__(self):
      self.turn = 0

    def reset(self, task):
      self.turn = 0
      return [{"role": "user", "content": task.prompt}]

    def step(self, text):
      self.turn += 1
      if self.turn >= a.turns:
        return EnvStep(done=True)
      out = answers[self.turn]
      return EnvStep(messages=({"role": "tool", "name": "run", "content": out},),
                     records=(ToolRecord("run", {"command": "python3 solution.py"}, out, 1),))

    def completion(self):
      return ""

  tasks = [Task("math", f"Write a Python function add(a, b) and test it. Attempt {i}.",
                answer="0") for i in range(a.episodes)]
  ctx = 256 + a.turns * (a.max_new + a.tool_tokens + 16)
  engine = JaxEngine(model, tok, JaxEngineConfig(max_batch=a.episodes, max_len=ctx,
                                                 kv_cache_mib=4096, min_prompt_bucket=32))
  sampling = SamplingParams(max_new_tokens=a.max_new, temperature=1.0, seed=11)
  caps = ep_lib.EpisodeCaps(max_turns=a.turns, max_context_tokens=ctx)
  renderer = ep_lib.Renderer(tok)
  load = os.getloadavg()[0]

  def batch(kv_reuse: bool):
    t0 = time.perf_counter()
    eps = ep_lib.run_episodes(engine, renderer, [ToolLoop() for _ in tasks], tasks,
                              sampling=sampling, caps=caps, kv_reuse=kv_reuse)
    wall = time.perf_counter() - t0
    # prefill work: KV reuse computes the opening prompts and the environment tokens;
    # re-prefill computes every turn's whole history
    if kv_reuse:
      pre = sum(len(e.prompt_ids) + sum(t.env_tokens for t in e.turns) for e in eps)
    else:
      pre = sum(len(e.prompt_ids) + t.span[0] for e in eps for t in e.turns)
    return eps, wall, pre

  res = {}
  for kv in (True, False):
    batch(kv)  # compiles
    runs = [batch(kv) for _ in range(a.repeats)]
    res[kv] = min(runs, key=lambda r: r[1])
  (e_kv, w_kv, pre_kv), (e_re, w_re, pre_re) = res[True], res[False]
  same = sum(x.ids == y.ids for x, y in zip(e_kv, e_re))
  model_tokens = sum(sum(e.mask) for e in e_kv)
  turns = sum(len(e.turns) for e in e_kv)
  note = (f"{a.episodes} episodes, {turns} model turns, {model_tokens} model tokens; "
          f"identical token ids in {same}/{a.episodes} episodes; load {load:.2f} at start")
  return [
      common.Row("model tokens/s", model_tokens / w_kv,
                 sum(sum(e.mask) for e in e_re) / w_re, "tok/s", True, note),
      common.Row("wall per batch", w_kv, w_re, "s", False),
      common.Row("prefill tokens computed", pre_kv, pre_re, "tokens", False,
                 "opening prompts + environment tokens vs every turn's history"),
  ]
