"""The reasoning-gym adapter: every generator is the domain "rg/<name>".

A task carries its reasoning-gym entry in `metadata["rg_entry"]`; the verifier
pulls the answer from the last `<answer>` tag (or `\\boxed{}`) and asks the
generator's own `score_answer`.

Exact scoring. reasoning-gym hands out partial credit that a policy can farm
without solving anything (catalogued in `GAMEABLE_PARTIAL_CREDIT`): the base
scorer gives len(gold)/len(answer) to any answer *containing* the gold, so
listing every candidate earns credit; many scorers pay 0.01-0.1 for any
parsable-but-wrong answer; some give a floor (word_sorting pays >= 0.2 for any
answer of the right shape, knights_knaves 0.3). By default the adapter therefore
scores 1 only when `score_answer` returns 1, else 0; `partial_credit` names the
generators whose graded score is passed through instead (none by default).
Several *different* `<answer>` tags score 0 with a "format" violation.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re

from rlpt.rewards import answers
from rlpt.rewards.registry import Verifier
from rlpt.types import RewardResult, Task

# Where reasoning-gym 0.1.25's partial credit can be had without solving the task
# (read from each generator's score_answer), besides the generators that keep the
# base scorer (`base_scorer_generators()`). The rest give only 0/1 or a graded score of a genuinely valid answer
# (e.g. quantum_lock / shortest_path: 0.5 for a correct but non-optimal path).
GAMEABLE_PARTIAL_CREDIT = {
    # substring containment: len(gold) / len(answer) when gold is inside the answer
    "codeio": "substring containment", "manipulate_matrix": "substring containment",
    "circuit_logic": "substring containment", "futoshiki": "length-ratio credit",
    "sudoku": "length-ratio credit",
    # a fixed reward for any parsable but wrong answer
    "jugs": "0.01 for parsable JSON", "graph_color": "0.01 for parsable JSON",
    "group_anagrams": "0.01 for parsable JSON", "cryptarithm": "0.01 if parsable",
    "string_insertion": "0.1 for a near miss", "spiral_matrix": "0.1 for right shape",
    "binary_matrix": "0.1 for right shape", "pool_matrix": "0.1 for right shape",
    "palindrome_generation": "0.02-0.05 for any palindrome / right letters",
    "sentence_reordering": "0.05 for any reordering", "advanced_geometry": "0.01-0.5 for format",
    "prime_factorization": "0.01-0.5 for partial factor lists", "gsm_symbolic": "0.01 for a number",
    "calendar_arithmetic": "0.05-0.1 for a near date", "power_function": "0.01 for a number",
    "fraction_simplification": "0.01-0.1 for any fraction", "rearc": "0.05 for right grid shape",
    "arc_agi": "0.05 for right grid shape", "propositional_logic": "0.05-0.25 for well-formed",
    "rubiks_cube": "0.01-0.05 for any move list", "color_cube_rotation": "0.01 for a colour",
    "knight_swap": "0.05 for a parsable move list", "emoji_mystery": "0.01 for any text",
    "rush_hour": "0.01 for any move list that does not solve", "boxnet": ">= 0.05 for any plan",
    "puzzle24": "0.01 for any expression",
    # graded similarity with a floor
    "word_sorting": ">= 0.2 for any list of the right words", "knights_knaves": ">= 0.3 if parsable",
    "letter_jumble": "per-word overlap", "figlet_font": "character overlap",
    "rectangle_count": "credit for a close guess", "time_intervals": "credit for a close guess",
}


@functools.cache
def base_scorer_generators() -> frozenset[str]:
  """Generators that use ProceduralDataset.score_answer (gold-inside-answer credit)."""
  from reasoning_gym.dataset import ProceduralDataset
  from reasoning_gym.factory import DATASETS
  return frozenset(n for n, (cls, _) in DATASETS.items()
                   if cls.score_answer is ProceduralDataset.score_answer)


@functools.cache
def _scorer(name: str):
  """A default-config dataset of generator `name`, used only for `score_answer`."""
  import reasoning_gym
  logging.getLogger("reasoning_gym").setLevel(logging.ERROR)
  if name == "composite":
    raise ValueError("composite entries are scored by their source generator")
  return reasoning_gym.create_dataset(name, size=1, seed=0)


def warm_scorer(name: str) -> None:
  """Builds (and caches) generator `name`'s scorer; a generator that fails to build
  is left to fail, with its own error, when a task of it is scored."""
  try:
    _scorer(name)
  except Exception:  # noqa: BLE001
    pass


def _halting_score(answer: str | None, entry: dict) -> float:
  """game_of_life_halting: reasoning-gym compares bool(answer) with bool(gold), and both
  are non-empty strings, so any non-empty answer scored 1 on every task. Here: the
  answer must be True or False (any case) and equal the gold."""
  if answer is None or answer.strip().lower() not in ("true", "false"):
    return 0.0
  return float(answer.strip().lower() == str(entry["answer"]).strip().lower())


_RUSH_MOVES = re.compile(r"\s*(?:[A-Z][+-]\d+[\s,]*)+")


def _rush_hour_score(answer: str | None, entry: dict) -> float:
  """rush_hour: reasoning-gym skips every illegal move silently and checks only the final
  board, so garbage moves around a solution (hedging) scored 1. Here: the answer is only
  moves, every one legal for its full length, and the last one leaves the board solved."""
  from reasoning_gym.games.rush_hour import Board
  if not isinstance(answer, str) or not _RUSH_MOVES.fullmatch(answer):
    return 0.0
  board = Board(entry["metadata"]["board_config"])
  for target, sign, num in re.findall(r"([A-Z])([+-])(\d+)", answer):
    i = ord(target) - ord("A")
    if not 0 <= i < len(board._pieces) or board._pieces[i].fixed or int(num) == 0:
      return 0.0
    steps = int(num) if sign == "+" else -int(num)
    piece = board._pieces[i]
    before = piece.position
    board.move(target, steps)
    if piece.position != before + piece.stride * steps:
      return 0.0  # blocked or off the board: an illegal move
  return float(board.solved)


_FORMULA = re.compile(r"[A-Z¬∧∨→↔()\s]+")


def _propositional_score(answer: str | None, entry: dict) -> float:
  """propositional_logic: reasoning-gym's parser accepts trailing text, so a list of
  formulas ("¬P, (R ∧ S), (R ∨ P)") scored as one conclusion. Here: one formula only
  (variables, ¬ ∧ ∨ → ↔, parentheses), then reasoning-gym's validity check."""
  if not isinstance(answer, str) or not _FORMULA.fullmatch(answer.strip()):
    return 0.0
  return float(_scorer("propositional_logic").score_answer(answer.strip(), entry))


_SOKOBAN_MOVES = re.compile(r"[UDLR]+")


def _sokoban_score(answer: str | None, entry: dict) -> float:
  """sokoban: reasoning-gym walks every character and ignores what is not a move, so
  several move strings joined by separators (hedging) could score. Here: one string of
  U/D/L/R only, then reasoning-gym's simulation."""
  if not isinstance(answer, str) or not _SOKOBAN_MOVES.fullmatch(answer.strip()):
    return 0.0
  return float(_scorer("sokoban").score_answer(answer.strip(), entry))


def _puzzle24_score(answer: str | None, entry: dict) -> float:
  """puzzle24: reasoning-gym checks that the expression makes 24 from four numbers in
  range, but not that they are the task's four numbers, so one constant ("1*2*2*6")
  scored 1 on every task. Here: the numbers used are exactly the task's (as a multiset),
  then reasoning-gym's check."""
  if not isinstance(answer, str):
    return 0.0
  used = sorted(int(n) for n in re.findall(r"\b\d+\b", answer))
  if used != sorted(int(n) for n in entry["metadata"]["numbers"]):
    return 0.0
  return float(_scorer("puzzle24").score_answer(answer, entry))


# Generators whose reasoning-gym scorer pays for answers that solve nothing, or for
# hedged lists of answers (found by launch.audit_rewards): scored here instead.
STRICT_SCORERS = {"game_of_life_halting": _halting_score, "rush_hour": _rush_hour_score,
                  "propositional_logic": _propositional_score, "sokoban": _sokoban_score,
                  "puzzle24": _puzzle24_score}


def raw_score(name: str, answer: str | None, entry: dict) -> float:
  """reasoning-gym's own score of `answer` for `entry` (graded, gameable), or the strict
  replacement of `STRICT_SCORERS`."""
  source = entry.get("metadata", {}).get("source_dataset", name)
  if name == "composite":
    name = source
  if name in STRICT_SCORERS:
    return STRICT_SCORERS[name](answer, entry)
  return float(_scorer(name).score_answer(answer, entry))


@dataclasses.dataclass
class RGVerifier(Verifier):
  """Scores completions of "rg/<generator>" tasks (see module doc).

  Attributes:
    generator: reasoning-gym generator name.
    sources: answer sources, in order.
    partial_credit: pass reasoning-gym's graded score through instead of 0/1.
    reject_multiple: several different final answers -> 0 and "format".
    timeout_s: budget of one verification in the worker process (seconds).
  """

  generator: str
  sources: tuple[str, ...] = ("answer_tag", "boxed")
  partial_credit: bool = False
  reject_multiple: bool = True
  timeout_s: float | None = 10.0
  isolation: str = "process"
  needs_prompt: bool = False

  def verify(self, task: Task, completion: str) -> RewardResult:
    entry = task.metadata.get("rg_entry")
    if entry is None:
      raise ValueError(f"rg task of domain {task.domain!r} lacks metadata['rg_entry']")
    got = answers.extract(completion, self.sources)
    details = {"answer": got.answer}
    if got.answer is None:
      return RewardResult(0.0, ("format",), details={**details, "reason": "no <answer> tag"})
    if self.reject_multiple and got.distinct > 1:
      return RewardResult(0.0, ("format",), details={
          **details, "reason": f"{got.distinct} different final answers"})
    try:
      raw = raw_score(self.generator, got.answer, entry)
    except Exception as e:  # noqa: BLE001 -- some scorers raise on malformed answers
      return RewardResult(0.0, (), details={**details, "raw_score": 0.0,
                                            "scorer_error": f"{type(e).__name__}: {e}"[:300]})
    score = raw if self.partial_credit else (1.0 if raw >= 1.0 - 1e-9 else 0.0)
    return RewardResult(score, (), details={**details, "raw_score": raw})


def generators() -> list[str]:
  """Every reasoning-gym generator name (106 in 0.1.25)."""
  from reasoning_gym.factory import DATASETS
  return sorted(DATASETS)
