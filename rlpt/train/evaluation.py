"""Holdout evaluation: greedy completions of each domain's held-out tasks, verified.

    evals = evaluate(engine, holdout, max_new_tokens=24, reward_config=settings.rewards)
    # {domain: {"accuracy": fraction scoring 1, "score": mean score, "n": tasks}}

Requests and verification go through the collector's functions, so a holdout task is
prompted and scored exactly as a training task is (temperature 0, one sample).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rlpt.rollout.engine import SamplingParams
from rlpt.train.collector import requests_for, to_rollouts, verify
from rlpt.types import Task


def evaluate(engine: Any, holdout: dict[str, Sequence[Task]], *, max_new_tokens: int,
             reward_config: Any = None, seed: int = 0) -> dict[str, dict[str, float]]:
  """Greedy (temperature 0) holdout evaluation per domain (see the module docstring)."""
  tasks = [t for d in sorted(holdout) for t in holdout[d]]
  if not tasks:
    return {}
  sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
  comps = engine.generate(requests_for(tasks, n=1, sampling=sp, seeds=[seed] * len(tasks)))
  rollouts = to_rollouts(tasks, comps, n=1)
  verify(rollouts, reward_config)
  out: dict[str, dict[str, float]] = {}
  for d in sorted(holdout):
    scores = [r.reward.score for r in rollouts if r.task.domain == d]
    out[d] = {"accuracy": float(np.mean([s >= 1.0 for s in scores])),
              "score": float(np.mean(scores)), "n": len(scores)}
  return out


def eval_metrics(ev: dict[str, dict[str, float]]) -> dict[str, float]:
  """The metrics.jsonl fields of one evaluation: eval/accuracy/<domain>,
  eval/score/<domain> and their mean accuracy eval/accuracy."""
  row = {f"eval/accuracy/{d}": v["accuracy"] for d, v in ev.items()}
  row.update({f"eval/score/{d}": v["score"] for d, v in ev.items()})
  if ev:
    row["eval/accuracy"] = float(np.mean([v["accuracy"] for v in ev.values()]))
  return row
