"""The nouns every stage of the RL loop passes on.

A `Task` comes from a task source, a `Rollout` is one sampled completion of it
(tokens, logprobs, the weight version that produced it), and a `RewardResult` is
the verifier's judgement of that completion.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class Task:
  """One verifiable task.

  Attributes:
    domain: registry key of the verifier, e.g. "math", "code", "rg/chain_sum".
    prompt: the text shown to the model (before any chat template).
    answer: what the verifier checks against (gold answer, hidden tests, ...);
      never shown to the model.
    metadata: domain-specific extras (e.g. {"entry_point": "f"} for code).
  """

  domain: str
  prompt: str
  answer: Any = None
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

  def messages(self) -> tuple[dict[str, str], ...]:
    """The chat messages that open this task: one user turn holding the prompt. RL
    requests and SFT demonstrations both render these with the model's chat template."""
    return ({"role": "user", "content": self.prompt},)


def task_key(task: Task) -> str:
  """A stable identity of a task's content (domain, prompt, answer, metadata): what the
  mixer's exclusion list and the scheduler's admission cache hold."""
  blob = json.dumps([task.domain, task.prompt, task.answer, task.metadata], sort_keys=True,
                    default=repr)
  return hashlib.sha1(blob.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """A verifier's verdict on one completion.

  Attributes:
    score: the verifier's score in [0, 1].
    violations: names of rule violations found (e.g. "format", "timeout",
      "sandbox"); each may carry a configured penalty.
    reward: score - penalty(violations): the number the learner optimizes.
    details: free-form diagnostics (parsed answer, per-test records, ...).
  """

  score: float
  violations: tuple[str, ...] = ()
  reward: float = 0.0
  details: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Rollout:
  """One sampled completion of a task, as the learner consumes it.

  Attributes:
    task: the task that was prompted.
    prompt_ids: prompt token ids, int, [P].
    completion_ids: sampled token ids, int, [C].
    completion_text: decoded completion.
    logprobs: per-token log-probabilities of `completion_ids` under the policy
      that sampled them, float32, [C]; at a rollout temperature T other than 1 (or 0),
      under softmax(logits / T), the distribution the learner trains.
    weight_version: version of the weights that produced this rollout.
    finish_reason: "stop" | "length" | "abort" ("not_generated" on the record of a
      group that failed before or during generation, rlpt.train.scheduler).
    group_id: index of the prompt group (all n samples of a prompt share it).
    reward: the verifier's result, filled in after verification.
    attempt: 1 for the first try; each re-dispatch (a fleet member died under it) or
      retried verification adds one.
    token_versions: per completion token, the weight version that sampled it, when
      they differ (a partial rollout, rl.inflight = "continue"); None otherwise.
      `weight_version` is then the first (oldest) token's.
    completion_mask: per completion token, whether the learner trains it; None =
      all of them. A multi-turn episode (rlpt.envs.episode) interleaves the model's
      sampled tokens (True) with the environment's (tool results: False, logprob 0).
    turns: an episode's turns, as the trajectory store keeps them (per turn: the
      model's text, its [start, end) in completion_ids, finish_reason, the tool
      calls with their outputs, exit statuses and violations, the environment's
      messages, and on the last turn "truncated": the cap that ended the episode,
      when one did); None for a single-turn rollout.
    verified_text: what the domain's verifier scores when it is not
      completion_text: an episode's final state (its last answer, or a file read
      back from its sandbox: rlpt.envs); None for a single-turn rollout.
  """

  task: Task
  prompt_ids: list[int]
  completion_ids: list[int]
  completion_text: str
  logprobs: list[float]
  weight_version: int
  finish_reason: str
  group_id: int = 0
  reward: RewardResult | None = None
  attempt: int = 1
  token_versions: list[int] | None = None
  completion_mask: list[bool] | None = None
  turns: list[dict[str, Any]] | None = None
  verified_text: str | None = None

  @property
  def scored_text(self) -> str:
    """The text the verifier scores: verified_text when set, else completion_text."""
    return self.completion_text if self.verified_text is None else self.verified_text
