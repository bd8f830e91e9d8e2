"""Disjoint train / holdout splits by a hash of a task's identifying text.

A task is held out when the CRC-32 of its key (its prompt, or a problem id) is
0 mod 5; so the split does not depend on seeds or on how many tasks were drawn,
and a holdout prompt can never be drawn for training. (The same rule as the
synthetic source's.)
"""

from __future__ import annotations

import zlib

import numpy as np

SPLITS = ("train", "holdout")
HOLDOUT_MODULUS = 5


def is_holdout(key: str) -> bool:
  """True for the one key in `HOLDOUT_MODULUS` (by CRC-32) that is held out."""
  return zlib.crc32(key.encode("utf-8")) % HOLDOUT_MODULUS == 0


def split_of(key: str) -> str:
  return "holdout" if is_holdout(key) else "train"


def check_index(domain: str, index: int) -> None:
  if not isinstance(index, int) or index < 0:
    raise IndexError(f"{domain}: task index must be an int >= 0, got {index!r}")


class GeneratedSource:
  """Seeded train/holdout splits for a source that generates each task from an rng.

  A subclass has `domain` and `seed` and defines `_make(rng) -> Task`; tasks are
  drawn by rejection on the prompt's split hash, so train and holdout never overlap.
  `train(i)` is a pure function of (seed, i); `holdout(n)` of (seed, n).
  """

  def _draw(self, rng, holdout: bool):
    while True:
      t = self._make(rng)
      if is_holdout(t.prompt) == holdout:
        return t

  def train(self, index: int):
    check_index(self.domain, index)
    return self._draw(np.random.default_rng([self.seed, 0, index]), holdout=False)

  def holdout(self, n: int) -> list:
    rng = np.random.default_rng([self.seed, 1])
    return [self._draw(rng, holdout=True) for _ in range(n)]
