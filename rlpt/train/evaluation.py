"""Holdout evaluation: greedy completions of each domain's held-out tasks, verified.

    evals = evaluate(engine, holdout, max_new_tokens=24, reward_config=settings.rewards)
    # {domain: {"accuracy": fraction scoring 1, "low", "high": its 95 % Wilson interval,
    #           "score": mean score, "n": tasks, "correct": [1, 0, ...] per task}}

Requests and verification go through the collector's functions, so a holdout task is
prompted and scored exactly as a training task is (temperature 0, one sample). The
held-out prompts go to the engine as one batch; a task that repeats an earlier one
(same domain, prompt and answer: small question spaces repeat) is decoded and verified
once and counted each time it occurs, since greedy decoding gives it the same
completion. The per-task outcomes ("correct", holdout order) are what
`rlpt.train.intervals.paired_gain` compares between two evaluations.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rlpt.rollout.engine import SamplingParams
from rlpt.train import intervals
from rlpt.train.collector import verify
from rlpt.train.scheduler import requests_for, to_rollouts
from rlpt.types import Task


def _key(t: Task) -> tuple[str, str, str]:
  return (t.domain, t.prompt, repr(t.answer))


def evaluate(engine: Any, holdout: dict[str, Sequence[Task]], *, max_new_tokens: int,
             reward_config: Any = None, seed: int = 0) -> dict[str, dict[str, Any]]:
  """Greedy (temperature 0) holdout evaluation per domain (see the module docstring)."""
  unique: dict[tuple[str, str, str], int] = {}
  tasks: list[Task] = []
  for d in sorted(holdout):
    for t in holdout[d]:
      if _key(t) not in unique:
        unique[_key(t)] = len(tasks)
        tasks.append(t)
  if not tasks:
    return {}
  sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
  comps = engine.generate(requests_for(tasks, n=1, sampling=sp, seeds=[seed] * len(tasks)))
  rollouts = to_rollouts(tasks, comps, n=1)
  verify(rollouts, reward_config)
  out: dict[str, dict[str, Any]] = {}
  for d in sorted(holdout):
    if not holdout[d]:
      continue
    scores = [float(rollouts[unique[_key(t)]].reward.score) for t in holdout[d]]
    correct = [int(s >= 1.0) for s in scores]
    ci = intervals.wilson(sum(correct), len(correct))
    out[d] = {"accuracy": ci.estimate, "low": ci.low, "high": ci.high,
              "score": float(np.mean(scores)), "n": len(scores), "correct": correct}
  return out


def gain(after: dict[str, Any], before: dict[str, Any]) -> intervals.Interval | None:
  """The paired RL - SFT style gain of one domain between two `evaluate` results
  (None when either lacks per-task outcomes or they cover different tasks)."""
  a, b = after.get("correct"), before.get("correct")
  if a is None or b is None or len(a) != len(b) or not a:
    return None
  return intervals.paired_gain(a, b)


def eval_metrics(ev: dict[str, dict[str, Any]]) -> dict[str, float]:
  """The metrics.jsonl fields of one evaluation: eval/accuracy/<domain>,
  eval/score/<domain> and their mean accuracy eval/accuracy."""
  row = {f"eval/accuracy/{d}": v["accuracy"] for d, v in ev.items()}
  row.update({f"eval/score/{d}": v["score"] for d, v in ev.items()})
  if ev:
    row["eval/accuracy"] = float(np.mean([v["accuracy"] for v in ev.values()]))
  return row
