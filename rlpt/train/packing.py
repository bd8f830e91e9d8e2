"""The learner's batch layout: each group's shared prompt runs once, logits only
where tokens are scored.

A rollout batch arrives row by row ([B, T]: prompt + completion, `attention_mask`
on real tokens, `loss_mask` on completion tokens). In RL the n rows of a group share
their prompt, and the prompt is most of a row (SmolLM2's chat prompt ~70 tokens
before a <= 24-token answer in the default experiment), so a row-by-row forward
pass spends most of its FLOPs on n copies of the same prompt, and a vocabulary
projection over every position spends most of the rest on positions nobody scores.

`pack` lays the batch out as S sequences of r rows each (r = the group size when
every group's rows share one prompt, else 1):

  sequence s = [prompt | continuation of row s*r | ... | continuation of row s*r+r-1]

where a row's continuation is its real tokens from its first scored one on. The
decoder runs the sequences with `segment_ids` (0 = the prompt, i + 1 = row i's
continuation, -1 = padding) and each continuation's own RoPE positions, so every
continuation token sees exactly what it saw in its row (rlpt.models.decoder.forward).
Per-token quantities live in a continuation window [B, Tc]: token j of row b's
continuation is `targets[b, j]`, predicted by the hidden state at `src[b, j]` of
sequence b // r, and sits in column `cols[b, j]` of the row layout.

Sizes: S * Tp tokens through the decoder (Tp = longest sequence, padded to a multiple
of `length_multiple`) instead of B * T; B * Tc positions through the vocabulary
projection instead of B * T.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packed:
  """A packed batch (numpy). Sequence-level fields are [S, Tp]; row-level [B, Tc].

  tokens: int32[S, Tp]; positions: int32[S, Tp] RoPE positions; segments: int32[S, Tp]
  (0 prompt, i + 1 continuation of the sequence's row i, -1 padding).
  src: int32[B, Tc] index into sequence b // rows_per_seq of the hidden state that
  predicts targets[b, j]; targets: int32[B, Tc]; loss_mask: bool[B, Tc] (scored, as
  in the row layout's loss_mask); cols: int32[B, Tc] column in the row layout;
  valid: bool[B, Tc] (a real continuation token).
  """

  tokens: np.ndarray
  positions: np.ndarray
  segments: np.ndarray
  src: np.ndarray
  targets: np.ndarray
  loss_mask: np.ndarray
  cols: np.ndarray
  valid: np.ndarray

  @property
  def rows_per_seq(self) -> int:
    return self.src.shape[0] // self.tokens.shape[0]

  def to_window(self, x_BxT: np.ndarray) -> np.ndarray:
    """A row-layout array [B, T] read at the continuation tokens -> [B, Tc] (0 elsewhere)."""
    x = np.asarray(x_BxT)
    return np.where(self.valid, np.take_along_axis(x, self.cols, axis=1), np.zeros((), x.dtype))

  def to_rows(self, x_BxTc: np.ndarray, T: int) -> np.ndarray:
    """The inverse of `to_window`: [B, Tc] -> [B, T], zeros off the continuations."""
    x = np.asarray(x_BxTc)
    out = np.zeros((x.shape[0], T), x.dtype)
    b, j = np.nonzero(self.valid)
    out[b, self.cols[b, j]] = x[b, j]
    return out


def _round_up(n: int, m: int) -> int:
  return max(m, -(-n // m) * m) if m > 1 else max(n, 1)


def pack(tokens, attention_mask, loss_mask, *, group_size: int = 1, share_prompts: bool = True,
         length_multiple: int = 16, window_multiple: int = 8,
         seq_divisor: int = 1) -> Packed:
  """Packs row-layout arrays ([B, T] each) into the shared-prompt layout.

  Rows b*group_size .. (b+1)*group_size-1 form a group. Prompts are shared (r =
  group_size) when `share_prompts`, B % group_size == 0, the number of groups is a
  multiple of `seq_divisor` (the devices the sequence axis is split over) and every
  group's non-empty rows have identical prompt tokens; otherwise r = 1 (one
  sequence per row: the same computation, no sharing). A row's prompt is its real
  tokens before its first scored token; rows without real tokens are padding and
  fit any group. A continuation's first token is scored only if a prompt token
  precedes it (nothing predicts a sequence's first token).
  """
  tokens = np.asarray(tokens)
  real = np.asarray(attention_mask, bool)
  scored = np.asarray(loss_mask, bool) & real
  B, T = tokens.shape
  pos_rows = np.maximum(np.cumsum(real, axis=1) - 1, 0)
  prompt_cols, cont_cols = [], []
  for b in range(B):
    cols = np.flatnonzero(real[b])
    hit = np.flatnonzero(scored[b, cols])
    first = int(hit[0]) if hit.size else cols.size
    prompt_cols.append(cols[:first])
    cont_cols.append(cols[first:])

  def shared(g0: int) -> bool:
    rows = [b for b in range(g0, g0 + group_size) if real[b].any()]
    ref = tokens[rows[0], prompt_cols[rows[0]]] if rows else None
    return all(np.array_equal(tokens[b, prompt_cols[b]], ref) for b in rows[1:])

  r = 1
  if (share_prompts and group_size > 1 and B % group_size == 0
      and (B // group_size) % max(seq_divisor, 1) == 0
      and all(shared(g0) for g0 in range(0, B, group_size))):
    r = group_size
  S = B // r
  # the row whose prompt sequence s carries: its first row with real tokens
  leads = [next((b for b in range(s * r, (s + 1) * r) if real[b].any()), s * r)
           for s in range(S)]
  seq_len = [prompt_cols[leads[s]].size + sum(cont_cols[b].size for b in range(s * r, (s + 1) * r))
             for s in range(S)]
  Tp = _round_up(max(seq_len), length_multiple)
  Tc = _round_up(max(c.size for c in cont_cols), window_multiple)

  p_tok = np.zeros((S, Tp), np.int32)
  p_pos = np.zeros((S, Tp), np.int32)
  p_seg = np.full((S, Tp), -1, np.int32)
  src = np.zeros((B, Tc), np.int32)
  tgt = np.zeros((B, Tc), np.int32)
  lm = np.zeros((B, Tc), bool)
  cols_w = np.zeros((B, Tc), np.int32)
  valid = np.zeros((B, Tc), bool)
  for s, lead in enumerate(leads):
    pc = prompt_cols[lead]
    P = pc.size
    p_tok[s, :P] = tokens[lead, pc]
    p_pos[s, :P] = pos_rows[lead, pc]
    p_seg[s, :P] = 0
    at = P
    for i, b in enumerate(range(s * r, (s + 1) * r)):
      cc = cont_cols[b]
      n = cc.size
      p_tok[s, at:at + n] = tokens[b, cc]
      p_pos[s, at:at + n] = pos_rows[b, cc]
      p_seg[s, at:at + n] = i + 1
      # token j is predicted by token j - 1 of the continuation, the first by the
      # prompt's last (and is not scored when there is no prompt: nothing precedes it)
      src[b, :n] = np.arange(at - 1, at + n - 1)
      tgt[b, :n] = tokens[b, cc]
      lm[b, :n] = scored[b, cc]
      cols_w[b, :n] = cc
      valid[b, :n] = True
      if n:
        src[b, 0] = max(P - 1, 0)
        lm[b, 0] &= P > 0
      at += n
  return Packed(p_tok, p_pos, p_seg, src, tgt, lm, cols_w, valid)
