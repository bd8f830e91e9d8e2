"""Disjoint train / holdout splits by a hash of a task's identifying text.

A task is held out when the CRC-32 of its key (its prompt, or a problem id) is
0 mod 5; so the split does not depend on seeds or on how many tasks were drawn,
and a holdout prompt can never be drawn for training. (The same rule as the
synthetic source's.)
"""

from __future__ import annotations

import zlib

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
