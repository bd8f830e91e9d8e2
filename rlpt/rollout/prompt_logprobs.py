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
