"""The environment interface: what one episode of one task looks like to the driver.

An environment turns a `Task` into the opening messages, answers each assistant
turn with tool or user messages until the episode is done, and then names the
text the domain's verifier scores (`completion()`: the final answer, or the final
state read back from the sandbox). The registry's `compute_reward` stays the one
reward path; the violations the environment recorded on the way (a malformed
tool call, a command that hung) are added to the verifier's before the penalty is
taken (`rlpt.envs.episode.score`).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

from rlpt.types import Task


@dataclasses.dataclass(frozen=True)
class ToolRecord:
  """One tool call of a turn, as the trajectory store keeps it."""
  tool: str                  # the tool's name ("" for a call that could not be read)
  arguments: dict[str, Any]  # {} for a call that could not be read
  output: str                # what the model was shown
  exit_code: int | None = None
  violation: str | None = None
  seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class EnvStep:
  """The environment's answer to one assistant turn.

  messages: chat messages appended after the turn (tool results; empty when done).
  done: the episode is over (the model answered, or gave up calling tools).
  records: the turn's tool calls, in order.
  """
  messages: tuple[dict[str, str], ...] = ()
  done: bool = False
  records: tuple[ToolRecord, ...] = ()

  @property
  def violations(self) -> tuple[str, ...]:
    return tuple(r.violation for r in self.records if r.violation)


class Environment(abc.ABC):
  """One episode at a time: reset, step until done, completion, close."""

  #: the tools the model may call, by name (for the prompt and the parser)
  tools: tuple[str, ...] = ()

  @abc.abstractmethod
  def reset(self, task: Task) -> list[dict[str, str]]:
    """Starts an episode of `task`; returns its opening messages."""

  @abc.abstractmethod
  def step(self, text: str) -> EnvStep:
    """Answers the assistant turn `text` (the model's decoded tokens)."""

  @abc.abstractmethod
  def completion(self) -> str:
    """What the domain's verifier scores once the episode ends."""

  def tool_seconds(self) -> float:
    """Summed tool time of this episode so far (EpisodeCaps.max_tool_s)."""
    return 0.0

  def close(self) -> None:
    """Releases what the episode held (its sandbox session)."""
