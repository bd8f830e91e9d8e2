"""prefill_packing: every prompt is recoverable from its rows, shared prefixes are held
once a row, and the cheapest layout is the one kept."""

import numpy as np
import pytest

from rlpt.models import decoder
from rlpt.rollout import prefill_packing as pp


def _rng_prompts(k, lo, hi, seed, prefix=()):
  rng = np.random.default_rng(seed)
  return [list(prefix) + [int(t) for t in rng.integers(10, 5000, size=int(rng.integers(lo, hi)))]
          for _ in range(k)]


def _check_recoverable(prompts, lay):
  """Each prompt's tokens and positions, read back through its (row, offset, prefix),
  with segment 0 under the prefix and one segment id of its own after it."""
  seen = set()
  for ids, (r, off, p) in zip(prompts, lay.place):
    n = len(ids)
    if n == 0:
      continue
    got = list(lay.tokens[r, :p]) + list(lay.tokens[r, off:off + n - p])
    assert got == list(ids)
    pos = list(lay.positions[r, :p]) + list(lay.positions[r, off:off + n - p])
    assert pos == list(range(n))
    assert (lay.segments[r, :p] == 0).all()
    own = set(lay.segments[r, off:off + n - p].tolist())
    if n - p:
      assert len(own) == 1 and min(own) >= 1 and not own & seen
      seen |= own
  live = sum(len(ids) for ids in prompts)
  assert (lay.segments >= 0).sum() <= live


def test_without_a_common_prefix_it_is_first_fit_decreasing():
  prompts = _rng_prompts(8, 3, 29, seed=0)
  lay = pp.pack(prompts, [32], attn_scale=3072.0)
  _check_recoverable(prompts, lay)
  assert not lay.shared and lay.tokens.shape[1] == 32
  assert all(p == 0 for _, _, p in lay.place)
  # first-fit decreasing: the longest prompt opens row 0 at column 0
  longest = max(range(8), key=lambda j: len(prompts[j]))
  assert lay.place[longest][:2] == (0, 0)


def test_a_shared_chat_template_is_held_once_a_row():
  template = list(range(100, 140))  # 40 tokens every prompt starts with
  prompts = _rng_prompts(16, 10, 30, seed=1, prefix=template)
  shared = pp.pack(prompts, [128, 256, 512], attn_scale=3072.0)
  plain = pp.pack(prompts, [128, 256, 512], attn_scale=3072.0, share=False)
  _check_recoverable(prompts, shared)
  _check_recoverable(prompts, plain)
  assert shared.shared and not plain.shared
  rows_used = {r for r, _, _ in shared.place}
  # every row holds the template once: prefix >= 40 for every prompt in a shared row
  assert all(p >= 40 for _, _, p in shared.place)
  assert (shared.segments == 0).sum() >= 40 * len(rows_used)
  # 16 x (40 + ~20) = ~960 tokens as plain rows; about 40 + 16 x 20 shared
  assert shared.columns <= plain.columns / 2, (shared.columns, plain.columns)
  live = sum(len(p) for p in prompts)
  assert shared.columns < live


def test_prompts_sorted_apart_share_only_with_their_neighbours():
  a, b = list(range(200, 230)), list(range(300, 330))
  prompts = (_rng_prompts(4, 5, 10, seed=2, prefix=a) + _rng_prompts(4, 5, 10, seed=3, prefix=b))
  order = [0, 4, 1, 5, 2, 6, 3, 7]  # interleaved as a mixed batch would come
  prompts = [prompts[i] for i in order]
  lay = pp.pack(prompts, [64, 128, 256], attn_scale=3072.0)
  _check_recoverable(prompts, lay)
  assert lay.shared
  for ids, (r, _, p) in zip(prompts, lay.place):
    mates = [q for q, (r2, _, _) in zip(prompts, lay.place) if r2 == r]
    if len(mates) > 1:  # the row holds exactly its prompts' longest common prefix
      lcp = 0
      while all(len(m) > lcp and m[lcp] == mates[0][lcp] for m in mates):
        lcp += 1
      assert p == lcp >= 30


def test_empty_prompts_take_no_columns_and_bad_widths_are_refused():
  prompts = [[], [5, 6, 7], []]
  lay = pp.pack(prompts, [32])
  _check_recoverable(prompts, lay)
  assert lay.place[0] == lay.place[2] == (0, 0, 0)
  assert (lay.segments >= 0).sum() == 3
  with pytest.raises(ValueError, match="width 4 < the longest prompt \\(5 tokens\\)"):
    pp.pack([[1, 2, 3, 4, 5]], [4])


def test_rows_are_rounded_as_compiled_and_the_cost_picks_the_width():
  assert [pp.padded_rows(n) for n in (0, 1, 3, 5, 8, 9, 17)] == [1, 1, 4, 8, 8, 16, 24]
  # 16 prompts of 31 tokens, no common prefix: 16 rows of 32 or 4 rows of 128 cost
  # the same columns; with attention counted the narrow rows win.
  prompts = _rng_prompts(16, 31, 32, seed=4)
  assert pp.pack(prompts, [32, 64, 128], attn_scale=100.0).tokens.shape == (16, 32)
  # SmolLM2's shape: a column's attention matches its projections at ~3k columns
  smol = decoder.ModelConfig(hidden_size=576, intermediate_size=1536, num_heads=9,
                             num_kv_heads=3, head_dim=64)
  assert 3000 < pp.attention_scale(smol) < 3200
