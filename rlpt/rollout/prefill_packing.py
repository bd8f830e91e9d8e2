"""How the prompts admitted together are laid out as prefill rows (host side, numpy).

A prefill computes every column of an [R, P] batch, padding included, so the layout
decides the cost. Two layouts are tried for each candidate row width P and the
cheapest kept:

* **first-fit decreasing**: prompts, longest first, each into the first row with room;
  prompts in a row do not attend to each other (one segment id each);
* **shared prefixes**: prompts in token order (so prompts that share a prefix are
  neighbours), each row filled in that order; a row of two or more prompts holds
  their longest common prefix once, as segment 0 in columns 0 .. p-1, and each
  prompt's remaining tokens after it (positions p ..), which attend to that prefix
  and to their own earlier tokens (`decoder.forward`'s segment 0). A chat template's
  system prompt and a domain's instructions (24 to 60 of the default holdout's ~98
  prompt tokens) are then computed once a row instead of once a prompt: what a
  radix cache saves, without keeping a cache.

The cost of a layout is rows x P x (1 + P / attn_scale): columns times the per-column
work, whose attention part grows with P (every column attends over the row's P
columns, masked or not). Rows are rounded to a power of two up to 8, then to a
multiple of 8, as the compiled program sees them. Both layouts compute exactly what
each prompt alone would (the masks leave each prompt its own causal context), so the
choice changes speed, never the keys and values.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
  """Prefill rows and where each prompt sits in them.

  Attributes:
    tokens, segments, positions: int32[R, P]; segment -1 is padding, 0 a row's shared
      prefix, >= 1 one prompt's own tokens; positions are within the prompt.
    place: per prompt (in the order given) (row, offset, prefix): its first `prefix`
      tokens are the row's columns 0 .. prefix-1, the rest start at column `offset`.
    shared: the shared-prefix layout was chosen.
  """

  tokens: np.ndarray
  segments: np.ndarray
  positions: np.ndarray
  place: tuple[tuple[int, int, int], ...]
  shared: bool

  @property
  def columns(self) -> int:
    """Columns the prefill computes (rows x P, padding included)."""
    return int(self.tokens.size)


def padded_rows(n: int) -> int:
  """Rows as compiled: a power of two up to 8, then a multiple of 8 (at least 1)."""
  n = max(n, 1)
  return 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8


def attention_scale(cfg) -> float:
  """Columns per row at which a prefill column's attention costs as much as its
  projections and MLP (a decoder `ModelConfig`): layer FLOPs per token over the
  4 x H x Dh FLOPs per attended key."""
  d, h, k, dh, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                    cfg.intermediate_size)
  per_token = 2 * (d * (h + 2 * k) * dh + h * dh * d + 3 * d * f)
  return per_token / (4 * h * dh)


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
  n = min(len(a), len(b), limit)
  i = 0
  while i < n and a[i] == b[i]:
    i += 1
  return i


def _first_fit(lens: Sequence[int], width: int) -> list[tuple[int, int, int, int]]:
  """(prompt, row, offset, prefix 0) for prompts of `lens` tokens, longest first."""
  fill, out = [], []
  for j in sorted(range(len(lens)), key=lambda j: -lens[j]):
    r = next((r for r, used in enumerate(fill) if used + lens[j] <= width), len(fill))
    if r == len(fill):
      fill.append(0)
    out.append((j, r, fill[r], 0))
    fill[r] += lens[j]
  return out


def _shared(prompts: Sequence[Sequence[int]], width: int) -> list[tuple[int, int, int, int]]:
  """(prompt, row, offset, prefix) with each row's common prefix held once."""
  order = sorted(range(len(prompts)), key=lambda j: tuple(prompts[j]))
  rows: list[tuple[int, list[int]]] = []  # (common prefix, members in token order)
  for j in order:
    if rows:
      p, members = rows[-1]
      q = _common(prompts[members[0]], prompts[j], p)  # sorted: LCP of the range
      total = sum(len(prompts[m]) for m in members) + len(prompts[j])
      if q + total - q * (len(members) + 1) <= width:
        rows[-1] = (q, members + [j])
        continue
    rows.append((len(prompts[j]), [j]))
  out = []
  for r, (p, members) in enumerate(rows):
    if len(members) == 1:  # alone in its row: its own segment, as first-fit lays it
      out.append((members[0], r, 0, 0))
      continue
    off = p
    for m in members:
      out.append((m, r, off, p))
      off += len(prompts[m]) - p
  return out


def _cost(placed, width: int, attn_scale: float) -> float:
  rows = 1 + max((r for _, r, _, _ in placed), default=0)
  return padded_rows(rows) * width * (1.0 + width / attn_scale)


def pack(prompts: Sequence[Sequence[int]], widths: Sequence[int], *,
         attn_scale: float = float("inf"), share: bool = True) -> Layout:
  """Lays out `prompts` (token ids to prefill; empty ones take no columns) in rows
  of one of `widths` columns (each at least the longest prompt), the cheapest layout
  by the module's cost (ties: the earlier width, first-fit before shared)."""
  lens = [len(p) for p in prompts]
  live = [j for j, n in enumerate(lens) if n > 0]
  longest = max(lens, default=0)
  best = None
  for width in widths:
    if width < longest:
      raise ValueError(f"prefill row width {width} < the longest prompt ({longest} tokens)")
    kinds = [(False, _first_fit([lens[j] for j in live], width))]
    if share and len(live) > 1:
      kinds.append((True, _shared([prompts[j] for j in live], width)))
    for shared, placed in kinds:
      cost = _cost(placed, width, attn_scale)
      if best is None or cost < best[0]:
        best = (cost, width, shared, placed)
  _, width, shared, placed = best
  R = padded_rows(1 + max((r for _, r, _, _ in placed), default=0))
  tokens = np.zeros((R, width), np.int32)
  segments = np.full((R, width), -1, np.int32)
  positions = np.zeros((R, width), np.int32)
  place = [(0, 0, 0)] * len(prompts)
  for seg, (i, r, off, p) in enumerate(placed, start=1):
    j = live[i]
    ids, n = prompts[j], lens[j]
    if p and off == p:  # the row's first prompt also writes the shared prefix
      tokens[r, :p] = ids[:p]
      segments[r, :p] = 0
      positions[r, :p] = np.arange(p)
    k = n - p
    tokens[r, off:off + k] = ids[p:]
    segments[r, off:off + k] = seg
    positions[r, off:off + k] = np.arange(p, n)
    place[j] = (r, off, p)
  return Layout(tokens=tokens, segments=segments, positions=positions, place=tuple(place),
                shared=shared)
