"""From tasks to verified rollouts and back to learner arrays (host side of an RL step).

    reqs = make_requests(tasks, n=8, sampling=sp, seeds=seeds)
    rollouts = to_rollouts(tasks, engine.generate(reqs), n=8, first_group=0)
    seconds = verify(rollouts, reward_config)              # fills rollout.reward
    arrays = pack(rollouts, pad_id=0)                      # numpy arrays for the learner

Rows of a batch are laid out group by group (the n samples of prompt g are rows
[g*n, (g+1)*n)), as rlpt.algorithms expects.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from rlpt.rollout.engine import Completion, GenerateRequest, SamplingParams
from rlpt.types import Rollout, Task


def make_requests(tasks: Sequence[Task], *, n: int, sampling: SamplingParams,
                  seeds: Sequence[int]) -> list[GenerateRequest]:
  """One chat-formatted request per task, `n` samples each, seeded per prompt."""
  return [GenerateRequest(messages=({"role": "user", "content": t.prompt},), n=n,
                          sampling=dataclasses.replace(sampling, seed=int(s)),
                          request_id=f"{t.domain}:{i}")
          for i, (t, s) in enumerate(zip(tasks, seeds))]


def to_rollouts(tasks: Sequence[Task], completions: Sequence[Completion], *, n: int,
                first_group: int = 0) -> list[Rollout]:
  """Completions (request order, samples in order) -> Rollouts with group ids."""
  if len(completions) != len(tasks) * n:
    raise ValueError(f"engine returned {len(completions)} completions for {len(tasks)} "
                     f"prompts x n={n}")
  out = []
  for j, c in enumerate(completions):
    g = j // n
    out.append(Rollout(task=tasks[g], prompt_ids=list(c.prompt_ids),
                       completion_ids=list(c.token_ids), completion_text=c.text,
                       logprobs=list(c.logprobs), weight_version=c.weight_version,
                       finish_reason=c.finish_reason, group_id=first_group + g))
  return out


def verify(rollouts: Sequence[Rollout], reward_config: Any = None) -> float:
  """Fills `rollout.reward` for every rollout with rlpt.rewards.compute_rewards
  (parallel, per-sample timeouts); returns wall seconds."""
  from rlpt.rewards import registry
  t0 = time.perf_counter()
  results = registry.compute_rewards([r.task for r in rollouts],
                                     [r.completion_text for r in rollouts], config=reward_config)
  for r, res in zip(rollouts, results):
    r.reward = res
  return time.perf_counter() - t0


def pack(rollouts: Sequence[Rollout], *, pad_id: int, length_multiple: int = 16,
         rows: int | None = None) -> dict[str, np.ndarray]:
  """Right-padded learner arrays, aligned like rlpt.models.token_logprobs.

  `rows` (>= len(rollouts)) pads the batch with empty rows (one attended pad
  token, no loss tokens, reward 0) so a short batch (DAPO after its refill
  budget) keeps the compiled shape; empty rows add nothing to any loss.

  Returns:
    tokens: int32[B, T], prompt then completion, then pad_id.
    attention_mask: bool[B, T], True on real tokens.
    loss_mask: bool[B, T], True on completion tokens.
    old_logprobs: float32[B, T], the rollout's logprob at each completion token, 0 elsewhere.
    rewards: float32[B]; lengths: int32[B] (completion tokens).
  T is the longest row rounded up to `length_multiple` (bounded recompiles).
  """
  B = len(rollouts) if rows is None else rows
  if B < len(rollouts):
    raise ValueError(f"pack: rows={rows} < {len(rollouts)} rollouts")
  longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
  T = -(-max(longest, 2) // length_multiple) * length_multiple
  tokens = np.full((B, T), pad_id, np.int32)
  attn = np.zeros((B, T), bool)
  loss = np.zeros((B, T), bool)
  old = np.zeros((B, T), np.float32)
  rewards = np.zeros((B,), np.float32)
  lengths = np.zeros((B,), np.int32)
  for b, r in enumerate(rollouts):
    p, c = len(r.prompt_ids), len(r.completion_ids)
    if len(r.logprobs) != c:
      raise ValueError(f"rollout {b}: {len(r.logprobs)} logprobs for {c} completion tokens")
    tokens[b, :p] = r.prompt_ids
    tokens[b, p:p + c] = r.completion_ids
    attn[b, :p + c] = True
    loss[b, p:p + c] = True
    old[b, p:p + c] = r.logprobs
    rewards[b] = r.reward.reward if r.reward is not None else 0.0
    lengths[b] = c
  attn[len(rollouts):, 0] = True
  return dict(tokens=tokens, attention_mask=attn, loss_mask=loss, old_logprobs=old,
              rewards=rewards, lengths=lengths)


def domain_means(rollouts: Sequence[Rollout], field: str = "reward") -> dict[str, float]:
  """Mean reward (or score) per task domain."""
  acc: dict[str, list[float]] = {}
  for r in rollouts:
    if r.reward is not None:
      acc.setdefault(r.task.domain, []).append(float(getattr(r.reward, field)))
  return {d: float(np.mean(v)) for d, v in sorted(acc.items())}


def evaluate(engine: Any, holdout: dict[str, Sequence[Task]], *, max_new_tokens: int,
             reward_config: Any = None, seed: int = 0) -> dict[str, dict[str, float]]:
  """Greedy (temperature 0) holdout evaluation per domain.

  Returns {domain: {"accuracy": fraction with score 1, "score": mean score,
  "n": tasks}}.
  """
  tasks = [t for d in sorted(holdout) for t in holdout[d]]
  if not tasks:
    return {}
  sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
  comps = engine.generate(make_requests(tasks, n=1, sampling=sp, seeds=[seed] * len(tasks)))
  rollouts = to_rollouts(tasks, comps, n=1)
  verify(rollouts, reward_config)
  out: dict[str, dict[str, float]] = {}
  for d in sorted(holdout):
    rs = [r for r in rollouts if r.task.domain == d]
    scores = [r.reward.score for r in rs]
    out[d] = {"accuracy": float(np.mean([s >= 1.0 for s in scores])),
              "score": float(np.mean(scores)), "n": len(rs)}
  return out
