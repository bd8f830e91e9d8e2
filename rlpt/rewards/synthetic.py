"""The verifier of the synthetic task (rlpt.data.synthetic): "synthetic" and every
"synthetic/<ops>" domain.

It compares the completion's first line, stripped, with the answer: score 1 for an
exact match, otherwise `partial` x (fraction of positions that match, over the longer
of the two strings), so a policy gets a graded signal from its first digit on. A
completion that is not all digits breaks the "format" rule. Pure and fast: it runs
inline.
"""

from __future__ import annotations

from rlpt.types import RewardResult, Task


def score_completion(answer: str, completion: str, *, partial: float = 0.5) -> RewardResult:
  """Exact match of the first line -> 1; else `partial` x positional match fraction."""
  pred = completion.split("\n", 1)[0].strip()
  violations = () if pred.isdigit() else ("format",)
  if pred == answer:
    return RewardResult(score=1.0, violations=(), details={"parsed": pred})
  width = max(len(answer), len(pred), 1)
  hits = sum(a == b for a, b in zip(answer, pred))
  return RewardResult(score=partial * hits / width, violations=violations,
                      details={"parsed": pred, "hits": hits})


def verify(task: Task, completion: str) -> RewardResult:
  """The "synthetic" domain's verifier (see module doc)."""
  if not isinstance(task.answer, str) or not task.answer.isdigit():
    raise ValueError(f"synthetic task has a non-digit answer {task.answer!r}")
  return score_completion(task.answer, completion)
