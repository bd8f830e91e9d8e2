"""A synthetic verifiable task small enough for a tiny random model to learn by RL.

Domain "synthetic": the prompt is a short digit string and an operation; the
answer is the digit string the operation produces.

    copy     "copy 472="   -> "472"
    reverse  "reverse 472=" -> "274"
    sum      "sum 4 7="    -> "11"

(the op word is left out of the prompt when a source has a single op: "472=").
Its verifier (rlpt.rewards.synthetic, registered for "synthetic" and every
"synthetic/<ops>" domain) compares the completion's first line with the answer.

`tokenizer()` builds the matching character-level tokenizer
(rlpt.models.tokenizer.CharTokenizer: <pad>/<bos>/<eos>, digits, space, '=', newline,
and the letters of the op names when a source mixes several ops).
"""

from __future__ import annotations

import dataclasses
import string
import zlib
from typing import Sequence

import numpy as np

from rlpt.models.tokenizer import CharTokenizer, char_backend
from rlpt.types import Task

DOMAIN = "synthetic"
OPS = ("copy", "reverse", "sum")
# The characters of single-op prompts and answers; multi-op prompts add the
# letters of the op names (`chars_for`). A small vocabulary keeps a random
# policy's chance of a right digit high enough for RL to start.
CHARS = tuple(string.digits) + (" ", "=", "\n")


def chars_for(ops_per_domain: Sequence[Sequence[str]]) -> tuple[str, ...]:
  """The vocabulary characters synthetic domains with these op lists need."""
  letters = sorted({ch for ops in ops_per_domain if len(ops) > 1 for op in ops for ch in op})
  return CHARS + tuple(letters)
_HOLDOUT_SALT = 0x5EED_0F_4EAD


def _answer(op: str, digits: str) -> str:
  if op == "copy":
    return digits
  if op == "reverse":
    return digits[::-1]
  if op == "sum":
    return str(sum(int(d) for d in digits))
  raise ValueError(f"synthetic: unknown op {op!r}; expected one of {OPS}")


@dataclasses.dataclass(frozen=True)
class SyntheticSource:
  """Seeded, index-addressed task source of the "synthetic" domain.

  Train task i is a pure function of (seed, i); the holdout list is a pure
  function of (seed, n). Train and holdout prompts are disjoint: one prompt in
  five (by a hash of its text) is held out, so a holdout score measures how
  well the learned rule generalizes to prompts never trained on.

  Attributes:
    ops: operations to mix (uniformly).
    length: digits per prompt (an int, or a (min, max) range inclusive).
    seed: stream seed.
  """

  ops: tuple[str, ...] = ("copy",)
  length: tuple[int, int] = (2, 2)
  seed: int = 0
  domain: str = DOMAIN

  def __post_init__(self):
    for op in self.ops:
      if op not in OPS:
        raise ValueError(f"synthetic: unknown op {op!r}; expected one of {OPS}")
    lo, hi = self.length
    if not 1 <= lo <= hi <= 16:
      raise ValueError(f"synthetic: length must satisfy 1 <= min <= max <= 16, got {self.length}")

  def _make(self, rng: np.random.Generator) -> Task:
    op = self.ops[int(rng.integers(len(self.ops)))]
    n = int(rng.integers(self.length[0], self.length[1] + 1))
    digits = "".join(str(d) for d in rng.integers(0, 10, size=n))
    body = " ".join(digits) if op == "sum" else digits
    prompt = (f"{op} {body}=" if len(self.ops) > 1 else f"{body}=")
    return Task(self.domain, prompt, answer=_answer(op, digits), metadata={"op": op})

  def _draw(self, rng: np.random.Generator, holdout: bool) -> Task:
    while True:  # rejection: train and holdout prompts are disjoint by a hash
      t = self._make(rng)
      if is_holdout_prompt(t.prompt) == holdout:
        return t

  def train(self, index: int) -> Task:
    """Training task number `index` (>= 0)."""
    if index < 0:
      raise IndexError(f"synthetic: task index must be >= 0, got {index}")
    return self._draw(np.random.default_rng([self.seed, int(index)]), holdout=False)

  def holdout(self, n: int) -> list[Task]:
    """The first `n` holdout tasks; their prompts never occur in `train`."""
    rng = np.random.default_rng([self.seed, _HOLDOUT_SALT])
    return [self._draw(rng, holdout=True) for _ in range(n)]


def is_holdout_prompt(prompt: str) -> bool:
  """One prompt in five (by CRC-32) is reserved for evaluation."""
  return zlib.crc32(prompt.encode()) % 5 == 0


def char_tokenizer(chars: Sequence[str] = CHARS):
  """The character-level HF `tokenizers.Tokenizer` of `chars`
  (rlpt.models.tokenizer.char_backend: <pad>, <bos>, <eos>, then one id per character)."""
  return char_backend(chars)


def tokenizer(chars: Sequence[str] = CHARS) -> CharTokenizer:
  """The tiny policy's tokenizer over `chars` (rlpt.models.tokenizer.CharTokenizer)."""
  return CharTokenizer(chars)
