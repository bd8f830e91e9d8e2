"""The collector's output: one step's verified rollouts and the learner's row arrays.

    batch = collector.collect(step_key)       # RolloutBatch (immutable)
    batch.rollouts                            # every rollout of the step, failures included
    batch.trained                             # which of them the learner trains, in row order
    batch.rows.tokens                         # int32[R, T], R = prompts_per_step x n rows

Rows are laid out group by group (the n samples of prompt g are rows [g*n, (g+1)*n)),
as rlpt.algorithms expects; rows past the trained ones are empty (one attended pad
token, no loss token, reward 0), so a short batch (DAPO after its refill budget) keeps
the compiled shape and adds nothing to any loss.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from rlpt.types import Rollout


def _frozen(x: np.ndarray) -> np.ndarray:
  x.setflags(write=False)
  return x


@dataclasses.dataclass(frozen=True)
class RowArrays:
  """Right-padded learner arrays, aligned like rlpt.models.token_logprobs.

  tokens: int32[R, T], prompt then completion, then pad_id.
  attention_mask: bool[R, T], True on real tokens.
  loss_mask: bool[R, T], True on completion tokens (those of the model's turns only
    where a rollout has a completion_mask: a multi-turn episode).
  old_logprobs: float32[R, T], the engine's logprob at each completion token, 0 elsewhere.
  rewards: float32[R], the shaped reward the learner optimizes (0 on empty rows).
  group_ids: int32[R], the row's prompt group (-1 on empty rows).
  T is the longest row rounded up to a multiple (bounded recompiles).
  """

  tokens: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray
  old_logprobs: np.ndarray
  rewards: np.ndarray
  group_ids: np.ndarray


def pack_rows(rollouts: Sequence[Rollout], rewards: np.ndarray, *, pad_id: int,
              length_multiple: int = 16, rows: int | None = None) -> RowArrays:
  """RowArrays of `rollouts` with their shaped `rewards` (float[K]); `rows` (>= K)
  pads with empty rows (see the module docstring)."""
  R = len(rollouts) if rows is None else rows
  if R < len(rollouts):
    raise ValueError(f"pack_rows: rows={rows} < {len(rollouts)} rollouts")
  if len(rewards) != len(rollouts):
    raise ValueError(f"pack_rows: {len(rewards)} rewards for {len(rollouts)} rollouts")
  longest = max((len(r.prompt_ids) + len(r.completion_ids) for r in rollouts), default=0)
  T = -(-max(longest, 2) // length_multiple) * length_multiple
  tokens = np.full((R, T), pad_id, np.int32)
  attn = np.zeros((R, T), bool)
  loss = np.zeros((R, T), bool)
  old = np.zeros((R, T), np.float32)
  out_rewards = np.zeros((R,), np.float32)
  groups = np.full((R,), -1, np.int32)
  for b, r in enumerate(rollouts):
    p, c = len(r.prompt_ids), len(r.completion_ids)
    if len(r.logprobs) != c:
      raise ValueError(f"rollout {b}: {len(r.logprobs)} logprobs for {c} completion tokens")
    if r.completion_mask is not None and len(r.completion_mask) != c:
      raise ValueError(f"rollout {b}: completion_mask has {len(r.completion_mask)} entries for "
                       f"{c} completion tokens")
    tokens[b, :p] = r.prompt_ids
    tokens[b, p:p + c] = r.completion_ids
    attn[b, :p + c] = True
    loss[b, p:p + c] = True if r.completion_mask is None else np.asarray(r.completion_mask, bool)
    old[b, p:p + c] = r.logprobs
    groups[b] = r.group_id
  out_rewards[:len(rollouts)] = rewards
  attn[len(rollouts):, 0] = True
  return RowArrays(*(_frozen(x) for x in (tokens, attn, loss, old, out_rewards, groups)))


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
  """One step's rollouts, as the collector hands them to the learner.

  Attributes:
    rollouts: every rollout generated this step (dropped groups included), group by
      group, each with its verifier's RewardResult.
    rewards: float32[N], each rollout's shaped reward (verifier reward + overlong shaping).
    trained: int[K], indices into `rollouts` of the rows the learner trains, in row order
      (whole groups; K = 0 when no group carried signal).
    rows: the learner's RowArrays of the trained rollouts, padded to the step's row count.
    group_size: samples per prompt (n).
    dropped_groups: groups dynamic sampling filtered out (zero reward variance).
    seconds_generate / seconds_verify: wall time in the engine and the verifiers (the
      asynchronous collector: the producers' time for the groups this batch consumed).
    stale: rollouts of groups the asynchronous collector dropped because their weight
      version lagged the learner by more than rl.max_staleness (never trained; not in
      `rollouts`, so no metric of the step averages them).
    retried: (rollout, error) of every failed attempt the scheduler retried
      (rlpt.train.scheduler), recorded only.
    dead: (rollout, reason) of every rollout (or the placeholder record) of a group the
      scheduler dead-lettered this step (every group has at least one record).
  """

  rollouts: tuple[Rollout, ...]
  rewards: np.ndarray
  trained: np.ndarray
  rows: RowArrays
  group_size: int
  dropped_groups: int = 0
  seconds_generate: float = 0.0
  seconds_verify: float = 0.0
  stale: tuple[Rollout, ...] = ()
  retried: tuple[tuple[Rollout, str], ...] = ()
  dead: tuple[tuple[Rollout, str], ...] = ()

  @property
  def dead_groups(self) -> int:
    """Groups the scheduler dead-lettered this step."""
    return len({r.group_id for r, _ in self.dead})

  @property
  def num_trained(self) -> int:
    return int(self.trained.shape[0])

  def weight_versions(self) -> np.ndarray:
    """int[N]: the weight version that produced each rollout."""
    return np.array([r.weight_version for r in self.rollouts], np.int64)

  def metrics(self) -> dict[str, float]:
    """The step's rollout metrics: reward and score over every rollout (per domain too),
    mean response length in tokens (also of correct and of incorrect answers apart),
    dropped groups, samples cut by the wall cap (rollout.max_wall_s, finish_reason
    "time"), generation and verification time, and the episodes' own
    (`episode_metrics`)."""
    rewards = np.array([r.reward.reward for r in self.rollouts])
    row = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
           "score_mean": float(np.mean([r.reward.score for r in self.rollouts])),
           "response_len": float(np.mean([len(r.completion_ids) for r in self.rollouts])),
           "dropped_groups": self.dropped_groups,
           "wall_capped": sum(r.finish_reason == "time" for r in self.rollouts),
           "dead_letter_groups": self.dead_groups, "retried_attempts": len(self.retried),
           "time/rollout_s": self.seconds_generate, "time/verify_s": self.seconds_verify}
    # Response length of full-marks (score 1) and other answers, apart: a length bias
    # (e.g. sequence-mean loss normalisation) shows in the wrong answers' length.
    for name, keep in (("correct", lambda sc: sc >= 1.0), ("incorrect", lambda sc: sc < 1.0)):
      lens = [len(r.completion_ids) for r in self.rollouts if keep(r.reward.score)]
      if lens:
        row[f"response_len/{name}"] = float(np.mean(lens))
    by_domain: dict[str, list[float]] = {}
    for r in self.rollouts:
      by_domain.setdefault(r.task.domain, []).append(float(r.reward.reward))
    row.update({f"reward_mean/{d}": float(np.mean(v)) for d, v in sorted(by_domain.items())})
    row.update(episode_metrics(self.rollouts))
    return row

  def recorded(self) -> tuple[list[Rollout], list[str], list[str]]:
    """Every rollout the step consumed, its outcome and its error, as the trajectory
    store records them: `rollouts` ("trained" or "filtered"), `stale` ("stale"),
    `retried` ("retried") and `dead` ("dead_letter")."""
    trained = set(self.trained.tolist())
    rollouts = list(self.rollouts) + list(self.stale)
    outcomes = (["trained" if i in trained else "filtered" for i in range(len(self.rollouts))]
                + ["stale"] * len(self.stale))
    errors = [""] * len(rollouts)
    for pairs, outcome in ((self.retried, "retried"), (self.dead, "dead_letter")):
      rollouts += [r for r, _ in pairs]
      outcomes += [outcome] * len(pairs)
      errors += [e for _, e in pairs]
    return rollouts, outcomes, errors

  def per_rollout(self, per_row: np.ndarray | None) -> np.ndarray:
    """float[N]: per-trained-row values (float[K]) placed at their rollouts, NaN elsewhere."""
    out = np.full(len(self.rollouts), np.nan)
    if per_row is not None and self.num_trained:
      out[self.trained] = per_row
    return out


def episode_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
  """Over a step's multi-turn episodes (rollouts with turns; {} when it has none):
  episode/count, model turns and tool calls per episode, the fraction of calls that
  broke a rule (episode/call_violation_frac), the fraction of episodes cut by a cap
  (episode/truncated_frac), summed tool seconds per episode."""
  eps = [r for r in rollouts if r.turns]
  if not eps:
    return {}
  calls = [c for r in eps for t in r.turns for c in t.get("tools", ())]
  return {"episode/count": float(len(eps)),
          "episode/turns": float(np.mean([len(r.turns) for r in eps])),
          "episode/tool_calls": len(calls) / len(eps),
          "episode/call_violation_frac": (float(np.mean([bool(c.get("violation")) for c in calls]))
                                          if calls else 0.0),
          "episode/truncated_frac": float(np.mean([bool(r.turns[-1].get("truncated"))
                                                   for r in eps])),
          "episode/tool_s": float(np.mean([sum(c.get("seconds", 0.0) for t in r.turns
                                               for c in t.get("tools", ())) for r in eps]))}

