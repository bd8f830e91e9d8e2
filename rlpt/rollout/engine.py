"""The rollout engine interface shared by the embedded JaxEngine and SGLang servers.

The learner and the fleet only see this interface: `generate` turns requests into
completions (token ids, text, per-token logprobs, the weight version that produced
them), and `update_weights` swaps the policy weights under a new version number.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Sequence

FINISH_REASONS = ("stop", "length", "abort", "time")
# "time": cut by SamplingParams.max_wall_s (a budget like max_new_tokens, in seconds).
CUT_AT_BUDGET = ("length", "time")  # the finish reasons of a sample cut by a budget


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample one request.

  Attributes:
    max_new_tokens: upper bound on generated tokens per sample.
    temperature: softmax temperature; 0 means greedy.
    top_p: nucleus mass in (0, 1]; 1 disables.
    top_k: keep the k most likely tokens; 0 disables.
    stop: stop strings; the completion ends before the first occurrence.
    stop_token_ids: extra token ids that end a sample (EOS is always one unless
      `ignore_eos`).
    ignore_eos: keep sampling past EOS (benchmarks use this so lengths match).
    seed: per-request seed; samples are a deterministic function of it.
    max_wall_s: wall seconds one sample may decode, counted from its admission into
      a decode slot (queueing before it does not count); a sample still running then
      ends with the tokens it has and finish_reason "time". None: no cap. A cap makes
      the cut point depend on the machine's speed, so runs that must replay exactly
      leave it off. Engines check it between decode chunks, so a sample may run one
      chunk past it.
  """

  max_new_tokens: int = 128
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop: tuple[str, ...] = ()
  stop_token_ids: tuple[int, ...] = ()
  ignore_eos: bool = False
  seed: int | None = None
  max_wall_s: float | None = None

  def __post_init__(self):
    if self.max_wall_s is not None and not self.max_wall_s > 0:
      raise ValueError(f"SamplingParams.max_wall_s must be > 0 seconds or None, "
                       f"got {self.max_wall_s!r}")


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
  """A prompt and how many samples to draw from it.

  Exactly one of `prompt_ids`, `messages` (chat messages rendered with the
  model's chat template, generation prompt added) or `text` is set.
  """

  prompt_ids: tuple[int, ...] | None = None
  messages: tuple[dict[str, str], ...] | None = None
  text: str | None = None
  n: int = 1
  sampling: SamplingParams = SamplingParams()
  request_id: str | None = None

  def __post_init__(self):
    given = [f for f in ("prompt_ids", "messages", "text") if getattr(self, f) is not None]
    if len(given) != 1:
      raise ValueError(
          f"GenerateRequest needs exactly one of prompt_ids, messages, text; got {given or 'none'}")
    if self.n < 1:
      raise ValueError(f"GenerateRequest.n must be >= 1, got {self.n}")


@dataclasses.dataclass
class Completion:
  """One sample of one request.

  Attributes:
    request_id: the request's id (engines fill one in when the request had none).
    sample_index: which of the request's n samples this is, in [0, n).
    prompt_ids: the prompt's token ids, [P].
    token_ids: generated token ids, [C] (stop strings/tokens excluded from text).
    text: decoded completion.
    logprobs: log p(token) under the policy at temperature 1, [C]; what the
      learner's importance ratio compares against.
    sampling_logprobs: log q(token) under the distribution actually sampled
      (temperature / top-p / top-k applied), [C].
    finish_reason: one of FINISH_REASONS.
    weight_version: version of the weights that produced every token (the first
      token's, see token_versions).
    attempt: which dispatch of its request produced it (a fleet re-dispatches a
      request whose member died: 2, 3, ...); 1 for engines that do not retry.
    token_versions: the weight version that sampled each token, [C], when the
      sample spans several (a partial rollout continued under new weights, see
      JaxEngine.generate(adopt_weights=True)); None when every token is
      `weight_version`'s. `weight_version` is then the first token's (the oldest).
  """

  request_id: str
  sample_index: int
  prompt_ids: list[int]
  token_ids: list[int]
  text: str
  logprobs: list[float]
  sampling_logprobs: list[float]
  finish_reason: str
  weight_version: int
  attempt: int = 1
  token_versions: list[int] | None = None


@dataclasses.dataclass(frozen=True)
class WeightUpdateStats:
  """What a weight swap cost: wall seconds and bytes moved (a fleet adds each
  member's seconds until it acknowledged, by member index)."""

  version: int
  seconds: float
  bytes: int
  per_member: dict[int, float] = dataclasses.field(default_factory=dict)


class RolloutEngine(abc.ABC):
  """Anything that samples completions from the current policy."""

  @property
  @abc.abstractmethod
  def weight_version(self) -> int:
    """Version of the weights every new completion is sampled from."""

  @abc.abstractmethod
  def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
    """Samples every request; returns completions grouped by request, in request
    order, samples in index order (len = sum of n)."""

  @abc.abstractmethod
  def update_weights(self, source: Any, version: int) -> WeightUpdateStats:
    """Replaces the weights with `source` (a params pytree or an Orbax checkpoint
    path) and tags later completions with `version`."""
