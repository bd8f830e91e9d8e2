"""The verifier of exact-integer answers: the "python_tool" domain.

The answer is the last `<answer>...</answer>` of the scored text (for an episode,
its final assistant turn: rlpt.envs). It must be one integer written plainly
(`-?[0-9]+`, surrounding spaces allowed): score 1 when it equals the task's
answer, else 0. No answer tag, several different answers (hedging), or anything
but a plain integer in the tag (an expression such as `4821 * 37 - 905`, a
decimal, digit separators) scores 0 with the "format" violation. Pure and fast:
it runs inline.
"""

from __future__ import annotations

import re

from rlpt.rewards import answers
from rlpt.types import RewardResult, Task

_INT = re.compile(r"-?[0-9]+")


def verify(task: Task, completion: str) -> RewardResult:
  """Scores `completion`'s final `<answer>` against `task.answer` (module docstring)."""
  try:
    gold = int(str(task.answer).strip())
  except ValueError:
    raise ValueError(f"{task.domain} task has a non-integer answer {task.answer!r}") from None
  ex = answers.extract(completion, ("answer_tag",))
  if ex.answer is None:
    return RewardResult(score=0.0, violations=("format",), details={"parsed": None})
  if ex.distinct > 1:
    return RewardResult(score=0.0, violations=("format",),
                        details={"parsed": ex.answer, "candidates": list(ex.candidates)})
  if not _INT.fullmatch(ex.answer.strip()):
    return RewardResult(score=0.0, violations=("format",), details={"parsed": ex.answer})
  got = int(ex.answer.strip())
  return RewardResult(score=float(got == gold), details={"parsed": got})
