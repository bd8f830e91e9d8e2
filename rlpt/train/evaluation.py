"""Holdout evaluation: greedy completions of each domain's held-out tasks, verified.

    evals = evaluate(engine, holdout, max_new_tokens=24, reward_config=settings.rewards)
    # {domain: {"accuracy": fraction scoring 1, "low", "high": its 95 % Wilson interval,
    #           "score": mean score, "n": tasks scored, "unscored": tasks whose verifier
    #           failed, "correct": [1, 0, None, ...] per task}}

Requests and verification go through the collector's functions (rlpt.train.generation),
so a holdout task is prompted and scored exactly as a training task is (temperature 0,
one sample; a task of an episodic domain is one greedy episode, played with or
without its tools as `episodes.with_tools` says). The
held-out prompts go to the engine as one batch; a task that repeats an earlier one
(same domain, prompt and answer: small question spaces repeat) is decoded and verified
once and counted each time it occurs, since greedy decoding gives it the same
completion. The per-task outcomes ("correct", holdout order) are what
`rlpt.train.intervals.paired_gain` compares between two evaluations.

    sampled = evaluate_sampled(engine, holdout, n=8, ks=(1, 4), max_new_tokens=24,
                               temperature=1.0)
    # {domain: {"pass@1", "pass@4": unbiased estimates over the domain's tasks,
    #           "score": mean score of the samples, "length": mean completion tokens,
    #           "violations": {name: samples}, "truncated": samples cut at the budget,
    #           "n_samples", "unscored"}}

pass@k is Chen et al. 2021's unbiased estimator from n samples of which c are right,
1 - C(n - c, k) / C(n, k), averaged over tasks (`pass_at_k`).

Infrastructure failures are never scored (as in training, rlpt.train.scheduler): a
batch whose verifier pool or sandbox could not run (VerifierUnavailable) is verified
again, up to `attempts` times with a doubling backoff, and then raised; a completion
whose verifier raised is verified again, and one that still fails is left out of its
domain's accuracy (`None` in "correct", counted in "unscored", its error in "errors")
rather than counted as wrong. Paired gains compare the tasks scored in both evaluations.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from rlpt.rewards import registry
from rlpt.rollout.engine import CUT_AT_BUDGET, SamplingParams
from rlpt.train import intervals
from rlpt.train import distributed, generation
from rlpt.train.generation import EpisodeSettings
from rlpt.types import Task


def _key(t: Task) -> tuple[str, str, str]:
  return (t.domain, t.prompt, repr(t.answer))


def verify_holdout(rollouts: Sequence[Any], reward_config: Any = None, *, attempts: int = 3,
                   backoff_s: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                   episodes: EpisodeSettings | None = None) -> dict[int, str]:
  """Fills `rollout.reward` of each rollout whose verifier gives a verdict (an
  episode's with its own violations and truncation rule, rlpt.train.generation.finish);
  returns {index: error} of those whose verifier failed on every one of `attempts`
  tries (their reward stays None). Raises VerifierUnavailable when the verification
  machinery itself still cannot run after `attempts` tries."""
  pending, errors = list(range(len(rollouts))), {}
  for attempt in range(attempts):
    if attempt:
      sleep(backoff_s * 2 ** (attempt - 1))
    try:
      rs = [rollouts[i] for i in pending]
      results = generation.finish(rs, registry.compute_rewards(
          [r.task for r in rs], [r.scored_text for r in rs], config=reward_config),
          episodes, reward_config)
    except registry.VerifierUnavailable:
      if attempt == attempts - 1:
        raise
      continue
    errors = {}
    for i, res in zip(pending, results):
      failure = registry.verifier_failure(res)
      if failure is None:
        rollouts[i].reward = res
      else:
        errors[i] = failure
    pending = sorted(errors)
    if not pending:
      break
  return errors


def evaluate(engine: Any, holdout: dict[str, Sequence[Task]], *, max_new_tokens: int,
             reward_config: Any = None, seed: int = 0, attempts: int = 3,
             backoff_s: float = 1.0, episodes: EpisodeSettings | None = None
             ) -> dict[str, dict[str, Any]]:
  """Greedy (temperature 0) holdout evaluation per domain (see the module docstring);
  episodic domains are played as greedy episodes under `episodes`."""
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
  # In a multi-process run each process decodes and verifies its block of the tasks
  # with its own engine, and every process gets all of them.
  lo, hi = distributed.shard_bounds(len(tasks))
  mine = (generation.generate(engine, tasks[lo:hi], n=1, sampling=sp,
                              seeds=[seed] * (hi - lo), episodes=episodes) if hi > lo else [])
  mine_failed = (verify_holdout(mine, reward_config, attempts=attempts, backoff_s=backoff_s,
                                episodes=episodes) if mine else {})
  rollouts, failed = [], {}
  for part, part_failed in distributed.allgather_objects(
      (mine, {lo + i: e for i, e in mine_failed.items()})):
    rollouts += part
    failed.update(part_failed)
  out: dict[str, dict[str, Any]] = {}
  for d in sorted(holdout):
    if not holdout[d]:
      continue
    idx = [unique[_key(t)] for t in holdout[d]]
    scores = [None if i in failed else float(rollouts[i].reward.score) for i in idx]
    correct = [None if x is None else int(x >= 1.0) for x in scores]
    scored = [x for x in scores if x is not None]
    ci = intervals.wilson(sum(c for c in correct if c is not None), len(scored))
    out[d] = {"accuracy": ci.estimate, "low": ci.low, "high": ci.high,
              "score": float(np.mean(scored)) if scored else float("nan"),
              "n": len(scored), "unscored": len(idx) - len(scored), "correct": correct}
    errs = sorted({failed[i] for i in idx if i in failed})
    if errs:
      out[d]["errors"] = errs[:5]
  return out


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k of one task from n samples with c correct:
  1 - C(n - c, k) / C(n, k), as a product so large n do not overflow.

  Raises:
    ValueError: k outside [1, n], or c outside [0, n].
  """
  n, c, k = int(n), int(c), int(k)
  if not 1 <= k <= n:
    raise ValueError(f"pass@k needs 1 <= k <= n (samples per task), got k={k}, n={n}")
  if not 0 <= c <= n:
    raise ValueError(f"pass@k: {c} correct out of {n} samples")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate_sampled(engine: Any, holdout: dict[str, Sequence[Task]], *, n: int,
                     ks: Sequence[int], max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, reward_config: Any = None, seed: int = 0,
                     attempts: int = 3, backoff_s: float = 1.0,
                     episodes: EpisodeSettings | None = None) -> dict[str, dict[str, Any]]:
  """n samples per held-out task at `temperature`: pass@k for each k in `ks`, mean
  score, length, violation and truncation counts per domain (see the module docstring).
  A sample whose verifier keeps failing is unscored; a task with fewer than k scored
  samples is left out of its pass@k."""
  for k in ks:
    if not 1 <= int(k) <= n:
      raise ValueError(f"pass@{k}: k must be in [1, n={n}] (--k and --n)")
  tasks = [t for d in sorted(holdout) for t in holdout[d]]
  if not tasks:
    return {}
  sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
  seeds = [seed * 1_000_003 + i for i in range(len(tasks))]
  rollouts = generation.generate(engine, tasks, n=n, sampling=sp, seeds=seeds, episodes=episodes)
  failed = verify_holdout(rollouts, reward_config, attempts=attempts, backoff_s=backoff_s,
                          episodes=episodes)
  out: dict[str, dict[str, Any]] = {}
  start = 0
  for d in sorted(holdout):
    m = len(holdout[d])
    rows = range(start * n, (start + m) * n)
    start += m
    if not m:
      continue
    scored = [i for i in rows if i not in failed]
    res: dict[str, Any] = {"n_tasks": m, "n_samples": len(rows), "unscored": len(rows) - len(scored)}
    for k in ks:
      per_task = []
      for t in range(m):
        ok = [rollouts[i].reward.score >= 1.0 for i in scored if (i - rows[0]) // n == t]
        if len(ok) >= k:
          per_task.append(pass_at_k(len(ok), sum(ok), k))
      res[f"pass@{k}"] = float(np.mean(per_task)) if per_task else float("nan")
    res["score"] = (float(np.mean([rollouts[i].reward.score for i in scored])) if scored
                    else float("nan"))
    res["length"] = float(np.mean([len(rollouts[i].completion_ids) for i in rows]))
    res["truncated"] = sum(rollouts[i].finish_reason in CUT_AT_BUDGET for i in rows)
    viol: dict[str, int] = {}
    for i in scored:
      for v in rollouts[i].reward.violations:
        viol[v] = viol.get(v, 0) + 1
    res["violations"] = dict(sorted(viol.items()))
    errs = sorted({failed[i] for i in rows if i in failed})
    if errs:
      res["errors"] = errs[:5]
    out[d] = res
  return out


def gain(after: dict[str, Any], before: dict[str, Any]) -> intervals.Interval | None:
  """The paired RL - SFT style gain of one domain between two `evaluate` results, over
  the tasks scored in both (None when either lacks per-task outcomes, they cover
  different tasks, or no task was scored in both)."""
  a, b = after.get("correct"), before.get("correct")
  if a is None or b is None:
    return None
  return intervals.paired_gain_scored(a, b)


def eval_metrics(ev: dict[str, dict[str, Any]]) -> dict[str, float]:
  """The metrics.jsonl fields of one evaluation: eval/accuracy/<domain>,
  eval/score/<domain> and their mean accuracy eval/accuracy."""
  row = {f"eval/accuracy/{d}": v["accuracy"] for d, v in ev.items()}
  row.update({f"eval/score/{d}": v["score"] for d, v in ev.items()})
  if ev:
    row["eval/accuracy"] = float(np.mean([v["accuracy"] for v in ev.values()]))
  return row
