"""Shared-prompt packing: the layout on a hand example, when it falls back to one
sequence per row, and that the learner's logprobs and gradients in the packed
layout equal the row-by-row ones (rlpt.models.token_logprobs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlpt.algorithms import AlgoSpec
from rlpt.models import Decoder, ModelConfig, token_logprobs
from rlpt.models.decoder import forward
from rlpt.train import learner as learner_lib
from rlpt.train import packing
from rlpt.train.learner import Learner
from rlpt.train.optim import OptimConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)


def test_layout_of_a_hand_example():
  # group of two rows with prompt [5, 6, 7]; row 1 is left-padded by one column
  tokens = np.array([[5, 6, 7, 1, 2, 0], [0, 5, 6, 7, 3, 0]], np.int32)
  attn = np.array([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0]], bool)
  lm = np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 0]], bool)
  pk = packing.pack(tokens, attn, lm, group_size=2, length_multiple=8, window_multiple=4)
  assert pk.rows_per_seq == 2
  np.testing.assert_array_equal(pk.tokens, [[5, 6, 7, 1, 2, 3, 0, 0]])
  np.testing.assert_array_equal(pk.positions, [[0, 1, 2, 3, 4, 3, 0, 0]])
  np.testing.assert_array_equal(pk.segments, [[0, 0, 0, 1, 1, 2, -1, -1]])
  # row 0's tokens 1, 2 are predicted from positions 2 (the prompt's last) and 3; row 1's
  # token 3 from position 2 as well
  np.testing.assert_array_equal(pk.src[:, :2], [[2, 3], [2, 0]])
  np.testing.assert_array_equal(pk.targets[:, :2], [[1, 2], [3, 0]])
  np.testing.assert_array_equal(pk.loss_mask, [[1, 1, 0, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(pk.cols[:, :2], [[3, 4], [4, 0]])
  x = np.arange(12, dtype=np.float32).reshape(2, 6)
  np.testing.assert_array_equal(pk.to_window(x), [[3, 4, 0, 0], [10, 0, 0, 0]])
  np.testing.assert_array_equal(pk.to_rows(pk.to_window(x), 6) * lm, x * lm)


def test_falls_back_to_one_sequence_per_row():
  tokens = np.array([[5, 6, 1], [5, 7, 1], [0, 0, 0], [5, 6, 2]], np.int32)
  attn = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]], bool)
  lm = np.array([[0, 0, 1], [0, 0, 1], [0, 0, 0], [0, 0, 1]], bool)
  assert packing.pack(tokens, attn, lm, group_size=2).rows_per_seq == 1  # prompts differ
  same = tokens.copy()
  same[1, 1] = 6
  assert packing.pack(same, attn, lm, group_size=2).rows_per_seq == 2
  # an empty row (no real tokens) fits any group
  assert packing.pack(same, attn, lm, group_size=2).tokens.shape[0] == 2
  assert packing.pack(same, attn, lm, group_size=2, share_prompts=False).rows_per_seq == 1
  # 2 groups cannot be split evenly over 4 devices
  assert packing.pack(same, attn, lm, group_size=2, seq_divisor=4).rows_per_seq == 1


def _group_batch(seed=0, groups=2, n=4, prompt=6, completion=5, T=14):
  """Groups of n rows sharing a random prompt; completions of varying length; one row
  left-padded (same prompt tokens in other columns)."""
  rng = np.random.default_rng(seed)
  B = groups * n
  tokens = np.zeros((B, T), np.int32)
  attn = np.zeros((B, T), bool)
  lm = np.zeros((B, T), bool)
  for g in range(groups):
    p = rng.integers(0, CFG.vocab_size, prompt)
    for i in range(n):
      b = g * n + i
      off = 2 if b == 1 else 0
      c = rng.integers(1, completion + 1)
      tokens[b, off:off + prompt] = p
      tokens[b, off + prompt:off + prompt + c] = rng.integers(0, CFG.vocab_size, c)
      attn[b, off:off + prompt + c] = True
      lm[b, off + prompt:off + prompt + c] = True
  return tokens, attn, lm


def test_packed_logprobs_and_gradient_equal_row_by_row():
  tokens, attn, lm = _group_batch()
  B, T = tokens.shape
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  ref_lp = np.asarray(token_logprobs(model, tokens, lm, attention_mask=attn))

  pk = packing.pack(tokens, attn, lm, group_size=4, length_multiple=8)
  assert pk.rows_per_seq == 4 and pk.tokens.shape[0] == 2
  assert pk.tokens.shape[1] < B * T // 2  # the point: half the tokens or fewer
  lp, ent, _ = jax.jit(learner_lib.logprobs_and_entropy)(
      model, pk.tokens, pk.positions, pk.segments, pk.src, pk.targets)
  np.testing.assert_allclose(pk.to_rows(np.asarray(lp), T) * lm, ref_lp, atol=2e-5)
  # entropy of the same next-token distributions, row by row
  logits = forward(CFG, model.arrays(), tokens, attention_mask=attn)
  p = jax.nn.softmax(logits, -1)
  ent_rows = -(p * jax.nn.log_softmax(logits, -1)).sum(-1)           # predicts t + 1
  ent_rows = np.concatenate([np.zeros((B, 1)), np.asarray(ent_rows)[:, :-1]], axis=1)
  np.testing.assert_allclose(pk.to_rows(np.asarray(ent), T) * lm, ent_rows * lm, atol=2e-5)

  # the learner's accumulated gradient (one group per microbatch) vs the row-layout loss
  rng = np.random.default_rng(1)
  adv = (rng.normal(size=(B, 1)) * lm).astype(np.float32)
  old = ref_lp - 0.1 * lm
  zeros = jnp.zeros(pk.src.shape)
  batch = learner_lib.Batch(pk.tokens, pk.positions, pk.segments, pk.src, pk.targets,
                            pk.loss_mask, pk.to_window(old), pk.to_window(adv), zeros, zeros,
                            zeros, jnp.ones(pk.src.shape))
  spec = AlgoSpec(loss_agg="seq_mean_token_mean")
  grads, stats = jax.jit(
      lambda p, b: learner_lib.loss_and_grads(graphdef, spec, 2, 8, p, b))(params, batch)

  def row_loss(p):
    lp = token_logprobs(nnx.merge(graphdef, p), tokens, lm, attention_mask=attn)
    m = jnp.asarray(lm, jnp.float32)
    per_tok = -adv * jnp.exp(lp - old) * m
    return jnp.mean(per_tok.sum(1) / m.sum(1))

  ref = jax.jit(jax.grad(row_loss))(params)
  for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)):
    np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-7)
  assert float(stats["tokens"]) == lm.sum()


def test_learner_shares_prompts_and_matches_unshared():
  tokens, attn, lm = _group_batch(seed=3)
  B = tokens.shape[0]
  out = []
  for share in (True, False):
    lrn = Learner(Decoder(CFG, rngs=nnx.Rngs(5)), AlgoSpec(), OptimConfig(lr=1e-3),
                  microbatch_size=4, share_prompts=share)
    lp = lrn.logprobs(tokens, attn, lm)
    batch = lrn.prepare(tokens, attn, lm, lp, np.arange(B, dtype=np.float32), group_size=4,
                        pad_multiple=8)
    assert batch.tokens.shape[0] == (2 if share else B)
    m = learner_lib.metrics_to_host(lrn.step(batch))
    assert m["logprob_gap_max"] < 1e-4
    out.append((m, lrn))
  (m1, l1), (m2, l2) = out
  for k in ("loss", "grad_norm", "entropy", "response_len", "tokens"):
    assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-6), k
  for x, y in zip(jax.tree.leaves(l1.state.params), jax.tree.leaves(l2.state.params)):
    np.testing.assert_allclose(x, y, atol=1e-5)


def test_segment_ids_need_a_cache_free_pass():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  from rlpt.models import init_cache
  cache = init_cache(CFG, 1, 8)
  with pytest.raises(ValueError, match="segment_ids"):
    forward(CFG, model.arrays(), jnp.zeros((1, 2), jnp.int32), cache=cache,
            segment_ids=jnp.zeros((1, 2), jnp.int32))
