"""The "extraction" verifier: field-level comparison of the model's JSON with the gold.

The answer is the last ```json block of the completion, else the last JSON
object in it. Per asked field:
  * money / per_share / count / pct: a JSON number, or a string that is *only* a
    number with optional currency sign, thousands separators, parentheses for
    negatives, a scale word ("thousand(s)", "k", "million(s)", "m", "mn",
    "billion(s)", "bn", "b") or "%"; equal to the gold within `rel_tol`
    (relative) / `abs_tol`. A percent field also accepts the fraction (0.125
    for 12.5%) when it is a bare number below 1 in magnitude. Booleans, lists,
    objects, nulls and strings with anything else in them are wrong.
  * text: equal after case-folding and collapsing whitespace.
Score = max(0, (correct - extra_key_cost * invented_keys) / asked): keys the task
did not ask for are invented and cost `extra_key_cost` fields each. No parsable
object -> 0 with a "format" violation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

from rlpt.rewards.registry import Verifier
from rlpt.types import RewardResult, Task

_SCALES = {"": 1.0, "k": 1e3, "thousand": 1e3, "thousands": 1e3, "m": 1e6, "mn": 1e6,
           "mm": 1e6, "million": 1e6, "millions": 1e6, "b": 1e9, "bn": 1e9, "billion": 1e9,
           "billions": 1e9}
_NUM = re.compile(
    r"^\s*(?P<neg1>-)?\s*(?P<cur>[$€£]|usd|eur|gbp)?\s*(?P<neg2>-)?\s*(?P<paren>\()?\s*"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)\s*(?P<paren2>\))?\s*"
    r"(?P<scale>thousands?|millions?|billions?|k|m|mn|mm|b|bn)?\s*(?P<pct>%)?\s*$",
    re.IGNORECASE)
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def parse_number(value) -> tuple[float, bool] | None:
  """(value, had_percent_sign) of a JSON number or a pure number string; None otherwise."""
  if isinstance(value, bool):
    return None
  if isinstance(value, (int, float)):
    return (float(value), False) if math.isfinite(value) else None
  if not isinstance(value, str) or len(value) > 64:
    return None
  m = _NUM.match(value)
  if not m or bool(m["paren"]) != bool(m["paren2"]):
    return None
  x = float(m["num"].replace(",", "")) * _SCALES[(m["scale"] or "").lower()]
  if m["neg1"] or m["neg2"] or m["paren"]:
    x = -x
  return x, bool(m["pct"])


def _close(a: float, b: float, rel_tol: float, abs_tol: float) -> bool:
  return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def field_correct(kind: str, gold, value, *, rel_tol: float = 5e-3, abs_tol: float = 5e-3) -> bool:
  """Whether `value` (from the model's JSON) matches `gold` for a field of `kind`."""
  if kind == "text":
    if not isinstance(value, str) or len(value) > 4 * len(str(gold)) + 16:
      return False
    norm = lambda s: " ".join(s.casefold().split())
    return norm(value) == norm(str(gold))
  parsed = parse_number(value)
  if parsed is None:
    return False
  x, pct_sign = parsed
  if kind == "pct":
    return _close(x, gold, rel_tol, abs_tol) or (
        not pct_sign and abs(x) < 1 and _close(100 * x, gold, rel_tol, abs_tol))
  if kind == "count":
    return abs(x - gold) < 0.5 or _close(x, gold, rel_tol, 0.0)
  if kind in ("money", "per_share"):
    return _close(x, gold, rel_tol, abs_tol)
  raise ValueError(f"extraction: unknown field kind {kind!r}")


def last_json_object(text: str):
  """The last ```json block that decodes to an object, else the last decodable {...}."""
  for block in reversed(_FENCE.findall(text)):
    try:
      obj = json.loads(block)
    except ValueError:
      continue
    if isinstance(obj, dict):
      return obj
  dec = json.JSONDecoder()
  found = None
  i = text.find("{")
  while i != -1:
    try:
      obj, end = dec.raw_decode(text, i)
    except ValueError:
      i = text.find("{", i + 1)
      continue
    if isinstance(obj, dict):
      found = obj
    i = text.find("{", end)
  return found


@dataclasses.dataclass
class ExtractionVerifier(Verifier):
  """Field-level score of a JSON answer (see module doc).

  Attributes:
    rel_tol: relative tolerance of numeric fields.
    abs_tol: absolute tolerance of numeric fields (per-share cents, percent points).
    extra_key_cost: fields of score lost per key the task did not ask for.
    all_or_nothing: score 1 only when every field is right and nothing invented.
    timeout_s: budget of one verification in the worker process (seconds).
  """

  rel_tol: float = 5e-3
  abs_tol: float = 5e-3
  extra_key_cost: float = 1.0
  all_or_nothing: bool = False
  timeout_s: float | None = 10.0
  isolation: str = "process"
  needs_prompt: bool = False

  def verify(self, task: Task, completion: str) -> RewardResult:
    kinds = task.metadata.get("fields")
    if not isinstance(task.answer, dict) or not isinstance(kinds, dict) or set(kinds) != set(task.answer):
      raise ValueError("extraction task needs answer=dict of gold fields and "
                       "metadata['fields'] with the same keys")
    obj = last_json_object(completion)
    if obj is None:
      return RewardResult(0.0, ("format",), details={"reason": "no JSON object found"})
    per_field = {k: field_correct(kinds[k], task.answer[k], obj.get(k), rel_tol=self.rel_tol,
                                  abs_tol=self.abs_tol) if k in obj else False for k in kinds}
    invented = sorted(str(k) for k in obj if k not in kinds)
    correct = sum(per_field.values())
    if self.all_or_nothing:
      score = float(correct == len(kinds) and not invented)
    else:
      score = max(0.0, (correct - self.extra_key_cost * len(invented)) / len(kinds))
    return RewardResult(score, (), details={"fields": per_field, "invented": invented[:50]})
