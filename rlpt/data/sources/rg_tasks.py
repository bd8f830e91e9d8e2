"""Task sources for "rg/<generator>": one per reasoning-gym generator.

Train task `i` is the first entry among the generator's entries
`8 i, ..., 8 i + 7` (a train-seeded dataset) whose question is not held out by
`splits.is_holdout`; holdout tasks are the held-out questions of a separately
seeded dataset, in order. Both are pure functions of (generator, seed, index).
The prompt is the question plus an instruction to answer inside
`<answer></answer>` tags; `metadata["rg_entry"]` carries the entry the verifier
scores against.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import zlib
from typing import Any

from rlpt.data.sources import splits
from rlpt.types import Task

INSTRUCTION = "\n\nGive your final answer inside <answer></answer> tags."
_STRIDE = 8
# Entries come from seeded chunks of _CHUNK entries (some generators precompute
# `size` entries at construction, so one huge dataset is not an option).
_CHUNK = 256
# The composite generator needs sub-generators; these are cheap and scorable.
COMPOSITE_PARTS = ("chain_sum", "letter_counting", "gcd")


def solve_rush_hour(board_config: str, max_states: int = 500_000) -> str | None:
  """A shortest move list ("A+1 C-1 ...") for a rush_hour board, by BFS over the
  bit masks of reasoning-gym's own Board / Piece encoding; None if unsolvable."""
  import collections
  from reasoning_gym.games import rush_hour as rh
  board = rh.Board(board_config)
  pieces = board._pieces  # noqa: SLF001 -- reasoning-gym's encoding, label = chr(65 + index)
  goal = rh.Piece(rh.TARGET, pieces[0].size, pieces[0].stride).mask
  walls = 0
  for p in pieces:
    if p.fixed:
      walls |= p.mask
  movable = [i for i, p in enumerate(pieces) if not p.fixed]
  edges = {(rh.H, -1): rh.LEFT_COLUMN, (rh.H, 1): rh.RIGHT_COLUMN,
           (rh.V, -1): rh.TOP_ROW, (rh.V, 1): rh.BOTTOM_ROW}
  start = tuple(p.mask for p in pieces)
  if start[0] == goal:
    return ""
  parent = {start: None}
  queue = collections.deque([start])
  while queue and len(parent) < max_states:
    state = queue.popleft()
    occupied = walls
    for m in state:
      occupied |= m
    for i in movable:
      m, stride = state[i], pieces[i].stride
      for step in (1, -1):
        if m & edges[(stride, step)]:
          continue
        moved = (m << stride) if step > 0 else (m >> stride)
        if (moved & ~m) & occupied:
          continue
        nxt = state[:i] + (moved,) + state[i + 1:]
        if nxt in parent:
          continue
        parent[nxt] = (state, f"{chr(65 + i)}{step:+d}")
        if nxt[0] == goal:
          moves = []
          while parent[nxt] is not None:
            nxt, mv = parent[nxt]
            moves.append(mv)
          return " ".join(reversed(moves))
        queue.append(nxt)
  return None


def reference_answer(entry: dict[str, Any]) -> str | None:
  """An answer reasoning-gym scores 1 for `entry`, or None when the entry has no
  reference solution (boxnet: its checker simulates any plan and the entry holds
  none). rush_hour's is found by BFS."""
  import json
  if entry.get("answer") is not None:
    return str(entry["answer"])
  meta = entry.get("metadata", {})
  if "board_config" in meta:  # rush_hour
    return solve_rush_hour(meta["board_config"])
  if "possible_answer" in meta:  # graph_color: a coloring as JSON
    return json.dumps(meta["possible_answer"])
  for k in ("example_answer", "example_correct_answer"):  # propositional_logic, rubiks_cube
    if k in meta:
      return str(meta[k])
  return None


@functools.lru_cache(maxsize=256)
def _chunk(generator: str, seed: int, config: tuple[tuple[str, Any], ...] = ()):
  import reasoning_gym
  logging.getLogger("reasoning_gym").setLevel(logging.ERROR)
  if generator == "composite":
    from reasoning_gym.composite import DatasetSpec
    specs = [DatasetSpec(name=n, weight=1.0, config={}) for n in COMPOSITE_PARTS]
    return reasoning_gym.create_dataset("composite", size=_CHUNK, seed=seed, datasets=specs)
  try:
    return reasoning_gym.create_dataset(generator, size=_CHUNK, seed=seed, **dict(config))
  except (TypeError, ValueError, AssertionError) as e:
    raise ValueError(f"rg/{generator}: reasoning-gym rejects the generator config "
                     f"{dict(config)}: {type(e).__name__}: {e}") from e


@dataclasses.dataclass(frozen=True)
class RGSource:
  """Seeded, index-addressed tasks of one reasoning-gym generator.

  Attributes:
    generator: a name in reasoning_gym.factory.DATASETS.
    seed: stream seed.
    config: the generator's config fields as sorted (name, value) pairs, e.g.
      (("max_digits", 1), ("max_terms", 2)) for easy basic_arithmetic; empty =
      reasoning-gym's defaults.
  """

  generator: str
  seed: int = 0
  config: tuple[tuple[str, Any], ...] = ()

  @property
  def domain(self) -> str:
    return f"rg/{self.generator}"

  def _entry(self, split: str, j: int) -> dict[str, Any]:
    """Entry `j` of the split's stream (chunk j // _CHUNK, seeded by (generator, split, seed, chunk))."""
    seed = zlib.crc32(f"{self.generator}/{split}/{self.seed}/{j // _CHUNK}".encode()) & 0x7FFFFFFF
    return _chunk(self.generator, seed, self.config)[j % _CHUNK]

  def _task(self, entry: dict[str, Any], split: str) -> Task:
    return Task(self.domain, entry["question"] + INSTRUCTION, answer=entry.get("answer"),
                metadata={"rg_entry": entry, "generator": self.generator, "split": split})

  def train(self, index: int) -> Task:
    """Training task number `index`; never a held-out question."""
    splits.check_index(self.domain, index)
    j = index * _STRIDE
    while True:  # P(8 held-out in a row) = 0.2**8; then it borrows the next slots
      entry = self._entry("train", j)
      if not splits.is_holdout(entry["question"]):
        return self._task(entry, "train")
      j += 1

  def holdout(self, n: int) -> list[Task]:
    """The first `n` held-out tasks (prefix-stable in n)."""
    out, j = [], 0
    while len(out) < n:
      entry = self._entry("holdout", j)
      if splits.is_holdout(entry["question"]):
        out.append(self._task(entry, "holdout"))
      j += 1
      if j > 200 * (n + 1):
        raise RuntimeError(f"{self.domain}: found only {len(out)} held-out questions in {j} "
                           "draws; the generator's question space is too small")
    return out

  def reference(self, task: Task) -> str | None:
    """A completion the verifier scores 1, or None (see `reference_answer`).

    Entries that carry the expression they ask about (basic_arithmetic,
    chain_sum, ...: metadata["expression"]) get a worked line first,
    "EXPRESSION = ANSWER", then the tagged answer, so that the model restates the
    sum before answering, the way it computes best. Measured on SmolLM2-135M
    (the earlier default experiment's one-digit domains, 20 SFT steps, greedy holdout):
    after SFT on bare `<answer>N</answer>` demonstrations 12.5 % (basic_arithmetic)
    and 9.4 % (chain_sum) were right; with the worked line 23.4 % and 43.8 %.
    """
    entry = task.metadata["rg_entry"]
    ans = reference_answer(entry)
    if ans is None:
      return None
    expr = (entry.get("metadata") or {}).get("expression")
    work = f"{expr.strip()} = {ans}\n" if isinstance(expr, str) and expr.strip() else ""
    return f"{work}<answer>{ans}</answer>"


def generators() -> list[str]:
  from reasoning_gym.factory import DATASETS
  return sorted(DATASETS)
