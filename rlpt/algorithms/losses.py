"""Policy losses, loss aggregation, entropy and the PPO value loss: pure jnp on [B, T].

A policy loss maps per-token log-probabilities to a per-token loss; an aggregation
mode turns that into a scalar. Aggregation is written as per-token weights w[B, T]
with loss = sum_{b,t} w[b,t] * l[b,t], computed once on the FULL batch: then the sum
over microbatches of sum(w * l) is exactly the full-batch loss, so gradient
accumulation changes nothing (rlpt.train.learner relies on this).

Policy-loss signature:

    fn(logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high, dual_clip_c)
        -> (loss float32[B, T], clipped float32[B, T])

  logprobs: log pi_theta(y_t), the learner's (carries the gradient);
  old_logprobs: log pi_old(y_t), the rollout engine's (a constant);
  advantages: A_t; mask: 1 on response tokens. `clipped` is 1 where clipping changed
  the loss (its masked mean is the clip fraction). Both are zero where mask is 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlpt.algorithms.registry import Registry

POLICY_LOSSES = Registry("policy loss (config.rl.policy_loss)")
LOSS_AGGS = Registry("loss aggregation (config.rl.loss_agg)")

sg = jax.lax.stop_gradient


def _clip_surrogate(ratio, adv, eps_low, eps_high):
  """-A*r and -A*clip(r, 1-eps_low, 1+eps_high): the two PPO surrogate terms."""
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  return unclipped, clipped


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=0.2,
             dual_clip_c=3.0):
  """PPO clip (Schulman et al. 2017), with DAPO's clip-higher (Yu et al. 2025) when
  eps_high > eps_low:

    r_t = exp(logp_t - old_logp_t)
    l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
  """
  del dual_clip_c
  m = mask.astype(jnp.float32)
  ratio = jnp.exp(logprobs.astype(jnp.float32) - sg(old_logprobs).astype(jnp.float32))
  adv = sg(advantages).astype(jnp.float32)
  l1, l2 = _clip_surrogate(ratio, adv, eps_low, eps_high)
  loss = jnp.maximum(l1, l2)
  return loss * m, (l2 > l1).astype(jnp.float32) * m


@POLICY_LOSSES.register("dual_clip")
def dual_clip(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=0.2,
              dual_clip_c=3.0):
  """Dual-clip PPO (Ye et al. 2020): for A_t < 0 the loss is also bounded by -c A_t, so a
  huge ratio on a bad action cannot blow up the update (c > 1, typically 3):

    l_t = max(-A r, -A clip(r, 1-eps_low, 1+eps_high))            if A_t >= 0
    l_t = min(max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), -c A)  if A_t < 0
  """
  if dual_clip_c <= 1.0:
    raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
  m = mask.astype(jnp.float32)
  ratio = jnp.exp(logprobs.astype(jnp.float32) - sg(old_logprobs).astype(jnp.float32))
  adv = sg(advantages).astype(jnp.float32)
  l1, l2 = _clip_surrogate(ratio, adv, eps_low, eps_high)
  ppo = jnp.maximum(l1, l2)
  bound = -dual_clip_c * adv
  neg = adv < 0
  loss = jnp.where(neg, jnp.minimum(ppo, bound), ppo)
  clipped = (l2 > l1) | (neg & (ppo > bound))
  return loss * m, clipped.astype(jnp.float32) * m


@POLICY_LOSSES.register("gspo")
def gspo(logprobs, old_logprobs, advantages, mask, *, eps_low=3e-4, eps_high=4e-4,
         dual_clip_c=3.0):
  """GSPO (Zheng et al. 2025): one importance ratio per sequence, the length-normalized
  likelihood ratio, clipped at sequence level (the paper uses eps 3e-4 / 4e-4):

    s_b = exp( (1/|y_b|) sum_t (logp_{b,t} - old_logp_{b,t}) )
    l_{b,t} = max(-A_{b,t} s'_{b,t}, -A_{b,t} clip(s'_{b,t}, 1-eps_low, 1+eps_high))

  written in the paper's GSPO-token form s'_{b,t} = sg[s_b] * exp(logp_t - sg[logp_t])
  (value s_b, gradient s_b * grad logp_t). With per-sequence advantages and
  seq_mean_token_mean aggregation this is exactly GSPO's sequence objective.
  """
  del dual_clip_c
  m = mask.astype(jnp.float32)
  lp = logprobs.astype(jnp.float32)
  length = jnp.maximum(m.sum(axis=1, keepdims=True), 1.0)
  seq_log_ratio = ((lp - sg(old_logprobs).astype(jnp.float32)) * m).sum(
      axis=1, keepdims=True) / length
  ratio = jnp.exp(sg(seq_log_ratio) + lp - sg(lp))
  adv = sg(advantages).astype(jnp.float32)
  l1, l2 = _clip_surrogate(ratio, adv, eps_low, eps_high)
  loss = jnp.maximum(l1, l2)
  return loss * m, (l2 > l1).astype(jnp.float32) * m


def policy_loss(name: str, logprobs, old_logprobs, advantages, mask, *, eps_low: float,
                eps_high: float, dual_clip_c: float = 3.0):
  """POLICY_LOSSES[name](...): (loss float32[B, T], clipped float32[B, T])."""
  return POLICY_LOSSES.get(name)(logprobs, old_logprobs, advantages, mask,
                                 eps_low=eps_low, eps_high=eps_high,
                                 dual_clip_c=dual_clip_c)


# ---------------------------------------------------------------- aggregation


def _rows_with_tokens(m):
  return jnp.maximum((m.sum(axis=1) > 0).sum(), 1).astype(jnp.float32)


@LOSS_AGGS.register("token_mean")
def token_mean(mask, *, constant=None):
  """loss = sum_{b,t} m l / sum_{b,t} m: every token of the batch weighs the same (DAPO)."""
  del constant
  m = mask.astype(jnp.float32)
  return m / jnp.maximum(m.sum(), 1.0)


@LOSS_AGGS.register("seq_mean_token_mean")
def seq_mean_token_mean(mask, *, constant=None):
  """loss = mean_b [ sum_t m l / sum_t m ]: GRPO's original per-sequence mean; B counts
  rows with at least one valid token."""
  del constant
  m = mask.astype(jnp.float32)
  length = jnp.maximum(m.sum(axis=1, keepdims=True), 1.0)
  return m / length / _rows_with_tokens(m)


@LOSS_AGGS.register("seq_mean_token_sum")
def seq_mean_token_sum(mask, *, constant=None):
  """loss = mean_b [ sum_t m l ]."""
  del constant
  m = mask.astype(jnp.float32)
  return m / _rows_with_tokens(m)


@LOSS_AGGS.register("constant")
def constant_norm(mask, *, constant=None):
  """Dr.GRPO (Liu et al. 2025): loss = mean_b [ sum_t m l ] / C with a constant C (the
  generation budget), removing GRPO's length bias from 1/|y_b|."""
  if not constant or constant <= 0:
    raise ValueError(f"loss_agg 'constant' needs a positive constant, got {constant}")
  m = mask.astype(jnp.float32)
  return m / _rows_with_tokens(m) / float(constant)


def loss_weights(name: str, mask, *, constant: float | None = None) -> jax.Array:
  """Per-token weights w float32[B, T] of aggregation `name` (see module docstring)."""
  return LOSS_AGGS.get(name)(mask, constant=constant)


def aggregate(name: str, per_token, mask, *, constant: float | None = None) -> jax.Array:
  """sum_{b,t} loss_weights(name, mask)[b,t] * per_token[b,t]: a scalar."""
  return jnp.sum(loss_weights(name, mask, constant=constant) * per_token)


# ---------------------------------------------------------------- entropy, value


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """H_t = -sum_v p_v log p_v with p = softmax(logits): logits [..., V] -> float32[...]."""
  logits = logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def logprobs_from_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[..., targets]: logits [B, T, V], targets int[B, T] -> [B, T]."""
  logits = logits.astype(jnp.float32)
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def value_loss(values, old_values, returns, mask, *, clip: float):
  """PPO's clipped value loss, per token: 0.5 * max((V - R)^2, (V_clip - R)^2) with
  V_clip = V_old + clip(V - V_old, -clip, clip). All [B, T]; zero where mask is 0."""
  v = values.astype(jnp.float32)
  v_old = sg(old_values).astype(jnp.float32)
  ret = sg(returns).astype(jnp.float32)
  v_clip = v_old + jnp.clip(v - v_old, -clip, clip)
  return 0.5 * jnp.maximum((v - ret) ** 2, (v_clip - ret) ** 2) * mask.astype(jnp.float32)
