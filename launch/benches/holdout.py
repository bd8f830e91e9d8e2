r"""The default experiment's holdout decode: JaxEngine's prefill with shared prefixes
beside the same engine laying out every prompt on its own (the packing before it).

  python -m launch.bench holdout [--json=FILE] [--per_domain=50] [--passes=2]

Both sides load SmolLM2-135M-Instruct (float32) with configs/default.py's rollout
engine settings and decode the first `per_domain` holdout tasks of each of the
default's domains, greedy, rollout.max_new_tokens new tokens, in holdout order
(domain by domain, as `evaluation.evaluate` sends them), through
`generation.generate`. The baseline engine sets `share_prefixes=False` and
`prefill_row_tokens=1`: rows of the longest prompt's bucket, first-fit decreasing,
as every admission was laid out before `prefill_packing`. The sides alternate, one
pass each per round; rows are the last round's (the first pays the compiles). Rows:
wall seconds, prefill seconds and columns computed, decode seconds, and how many
completions the two sides agree on token for token (they must all agree: the layouts
compute the same keys and values).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time

from launch.benches import common

BASELINE_NAME = "unshared_rows"


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench holdout")
  p.add_argument("--per_domain", type=int, default=50)
  p.add_argument("--passes", type=int, default=2)
  a = p.parse_args(args)
  logging.disable(logging.WARNING)
  from configs import default
  from rlpt.models import load_model
  from rlpt.rollout.jax_engine import JaxEngine
  from rlpt.rollout.requests import SamplingParams
  from rlpt.train import build, generation, settings

  s = settings.check_config(default.get_config())
  model, tok = load_model(s.model.name)
  tasks = [t for d in sorted(s.data.weights)
           for t in build.task_source(d, s.data, seed=s.seed).holdout(s.data.holdout_per_domain)
           [:a.per_domain]]
  cfg = s.rollout.engine_config(seed=0)
  engines = {"rlpt": JaxEngine(model, tok, cfg),
             "base": JaxEngine(model, tok, dataclasses.replace(cfg, share_prefixes=False,
                                                               prefill_row_tokens=1))}
  sp = SamplingParams(max_new_tokens=s.rollout.max_new_tokens, temperature=0.0)
  got: dict[str, tuple[float, object, list]] = {}
  for _ in range(max(a.passes, 1)):
    for side, eng in engines.items():
      t0 = time.perf_counter()
      out = generation.generate(eng, tasks, n=1, sampling=sp, seeds=[0] * len(tasks))
      got[side] = (time.perf_counter() - t0, eng.last_stats, [r.completion_ids for r in out])
  (w1, s1, o1), (w0, s0, o0) = got["rlpt"], got["base"]
  same = sum(x == y for x, y in zip(o1, o0))
  note = f"{len(tasks)} tasks, {s1.prompt_tokens} prompt tokens"
  return [
      common.Row("holdout decode wall", w1, w0, "s", False, note),
      common.Row("prefill", s1.prefill_seconds, s0.prefill_seconds, "s", False,
                 f"{s1.admissions} admissions"),
      common.Row("prefill columns computed", s1.prefill_columns, s0.prefill_columns, "columns",
                 False, f"shared-prefix layouts: {s1.shared_admissions} of {s1.admissions}"),
      common.Row("decode", s1.decode_seconds, s0.decode_seconds, "s", False,
                 f"{s1.decode_steps} steps of {s1.slots} slots"),
      common.Row("completions identical", same, len(tasks), "of tasks", True,
                 "greedy, token for token"),
  ]
