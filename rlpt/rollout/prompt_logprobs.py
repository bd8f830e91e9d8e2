"""Prompt (input-token) logprobs for the server's `return_logprob` / scoring requests.

One jitted forward per padded batch through `rlpt.models.token_logprobs`, so the
numbers are exactly the learner's. Batches are padded to power-of-two shapes
(rows and length) so the number of compiled shapes stays small.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlpt.models.logprobs import token_logprobs


class _Weights:
  """What `token_logprobs` reads from a model: `.config` and `.arrays()`."""

  def __init__(self, config, params):
    self.config = config
    self._params = params

  def arrays(self):
    return self._params


@functools.partial(jax.jit, static_argnums=0)
def _score(config, params, tokens_BxT, mask_BxT):
  return token_logprobs(_Weights(config, params), tokens_BxT, mask_BxT, attention_mask=mask_BxT)


def _bucket(x: int, lo: int) -> int:
  return max(lo, 1 << (max(1, x) - 1).bit_length())


def prompt_logprobs(config: Any, params: Any, prompts: Sequence[Sequence[int]],
                    max_batch: int = 16) -> list[np.ndarray]:
  """log p(prompt[j] | prompt[:j]) for every position of every prompt.

  Args:
    config: the model's `ModelConfig`.
    params: its parameter pytree (`Decoder.arrays()` layout).
    prompts: token id lists, each non-empty.
  Returns:
    one float32 array [P_i] per prompt; entry 0 is 0 (nothing predicts it).
  """
  out: list[np.ndarray] = [None] * len(prompts)  # type: ignore[list-item]
  order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
  for lo in range(0, len(order), max_batch):
    idx = order[lo:lo + max_batch]
    T = _bucket(max(len(prompts[i]) for i in idx), 16)
    B = _bucket(len(idx), 1)
    tokens = np.zeros((B, T), np.int32)
    mask = np.zeros((B, T), bool)
    for r, i in enumerate(idx):
      p = prompts[i]
      tokens[r, :len(p)] = p
      mask[r, :len(p)] = True
    lp = np.asarray(_score(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    for r, i in enumerate(idx):
      out[i] = lp[r, :len(prompts[i])].astype(np.float32)
  return out


@functools.partial(jax.jit, static_argnums=(0, 4))
def _score_top(config, params, tokens_BxT, mask_BxT, k):
  from rlpt.models.decoder import forward, output_logits
  positions = jnp.maximum(jnp.cumsum(mask_BxT, axis=1, dtype=jnp.int32) - 1, 0)
  h = forward(config, params, tokens_BxT, positions=positions, attention_mask=mask_BxT,
              return_hidden=True)
  lp = jax.nn.log_softmax(output_logits(config, params, h[:, :-1]).astype(jnp.float32), -1)
  chosen = jnp.take_along_axis(lp, tokens_BxT[:, 1:, None], axis=-1)[..., 0]   # [B, T-1]
  top_lp, top_id = jax.lax.top_k(lp, k)                                          # [B, T-1, k]
  return chosen, top_lp, top_id


def sequence_logprobs(config: Any, params: Any, seqs: Sequence[Sequence[int]], k: int,
                      max_positions: int = 4096
                      ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """Per sequence, (chosen [L], top_ids [L, k], top_lps [L, k]): at position j >= 1 the
  log-probability of seq[j] given seq[:j] and the k most likely tokens there, from one
  log-softmax (so a greedy token's logprob equals its top-1 value exactly); row 0 is
  zeros. Rows are batched up to `max_positions` tokens, since each holds full-vocabulary
  logits."""
  k = max(1, int(k))
  out: list[Any] = [None] * len(seqs)
  order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
  at = 0
  while at < len(order):
    idx = [order[at]]   # ascending lengths: the last row added sets the padded length
    while (at + len(idx) < len(order) and _bucket(len(idx) + 1, 1)
           * _bucket(len(seqs[order[at + len(idx)]]), 16) <= max_positions):
      idx.append(order[at + len(idx)])
    T = _bucket(max(len(seqs[i]) for i in idx), 16)
    B = _bucket(len(idx), 1)
    tokens = np.zeros((B, T), np.int32)
    mask = np.zeros((B, T), bool)
    for r, i in enumerate(idx):
      tokens[r, :len(seqs[i])] = seqs[i]
      mask[r, :len(seqs[i])] = True
    chosen, top_lp, top_id = (np.asarray(x) for x in _score_top(
        config, params, jnp.asarray(tokens), jnp.asarray(mask), k))
    for r, i in enumerate(idx):
      n = len(seqs[i])
      out[i] = tuple(np.concatenate([np.zeros((1,) + a.shape[2:], a.dtype), a[r, :n - 1]])
                     for a in (chosen, top_id, top_lp))
    at += len(idx)
  return out
