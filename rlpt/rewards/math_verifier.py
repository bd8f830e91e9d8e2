r"""The "math" verifier: math-verify equivalence of the final answer with the gold.

The answer is the last `\boxed{}` (or `<answer>` tag; the sources and their order
are configurable). A completion that offers several *different* final answers
scores 0 with a "format" violation: otherwise a model could box every option and
let the last-match rule pick for it. Gold is parsed first and passed first to
`math_verify.verify` (the comparison is not symmetric). Sets, intervals and
relations only match a gold of the same kind (math-verify's strict mode), so
`\{1,2,3,4\}` or `(-\infty, \infty)` never match `3`.

math-verify's own timeouts use SIGALRM (main thread only), so they are disabled
here; the verifier is "process"-isolated and the worker pool kills a call that
overruns (`timeout_s`), e.g. `\boxed{9^{9^{9^{9}}}}`.
"""

from __future__ import annotations

import dataclasses
import logging

from rlpt.rewards import answers
from rlpt.rewards.registry import Verifier
from rlpt.types import RewardResult, Task


def _parse(text: str):
  import math_verify
  cfg = [math_verify.LatexExtractionConfig(boxed_match_priority=0),
         math_verify.ExprExtractionConfig()]
  return math_verify.parse("\\boxed{" + text + "}", extraction_config=cfg, parsing_timeout=None)


def normalize_gold(gold: str) -> str:
  """Strips inline-math dollars and surrounding space from a gold answer string."""
  g = str(gold).strip()
  if len(g) >= 2 and g.startswith("$") and g.endswith("$"):
    g = g.strip("$").strip()
  return g


@dataclasses.dataclass
class MathVerifier(Verifier):
  """Scores 1 when the extracted answer is math-verify-equivalent to `task.answer`.

  Attributes:
    sources: where to look for the answer, in order ("boxed", "answer_tag").
    reject_multiple: several different final answers -> 0 and "format".
    max_answer_chars: longer extracted answers are rejected ("format") unparsed.
    float_rounding: decimal places math-verify rounds floats to.
    timeout_s: budget of one verification in the worker process (seconds).
  """

  sources: tuple[str, ...] = ("boxed", "answer_tag")
  reject_multiple: bool = True
  max_answer_chars: int = 1000
  float_rounding: int = 6
  timeout_s: float | None = 5.0
  isolation: str = "process"
  needs_prompt: bool = False

  def verify(self, task: Task, completion: str) -> RewardResult:
    import math_verify
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if task.answer is None:
      raise ValueError(f"math task has no gold answer (task.answer is None): {task.prompt[:80]!r}")
    got = answers.extract(completion, self.sources)
    details = {"answer": got.answer, "source": got.source}
    if got.answer is None:
      return RewardResult(0.0, ("format",), details={**details, "reason": "no final answer found"})
    if self.reject_multiple and got.distinct > 1:
      return RewardResult(0.0, ("format",), details={
          **details, "reason": f"{got.distinct} different final answers", "candidates": got.candidates})
    if len(got.answer) > self.max_answer_chars:
      return RewardResult(0.0, ("format",), details={
          **details, "reason": f"answer longer than {self.max_answer_chars} chars"})
    gold = _parse(normalize_gold(task.answer))
    if not gold:
      raise ValueError(f"math-verify cannot parse the gold answer {task.answer!r}")
    pred = _parse(got.answer)
    ok = math_verify.verify(gold, pred, float_rounding=self.float_rounding, timeout_seconds=None)
    return RewardResult(1.0 if ok else 0.0, (), details={**details, "parsed": [str(p) for p in pred]})
