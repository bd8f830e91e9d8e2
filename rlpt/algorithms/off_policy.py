"""Off-policy correction for rollouts sampled by older weights (asynchronous RL).

Three policies score a completion token y_t:

  mu        the behaviour policy: the weights that sampled y_t (the engine's logprob,
            recorded at sampling time)
  pi_prox   the proximal policy: the learner's parameters before this update
  pi_theta  the parameters being optimized

`config.rl.off_policy` (OFF_POLICY) picks how the policy loss uses them:

  none           the clipped ratio is pi_theta / mu (plain PPO: exact when every rollout
                 is on-policy, as in the synchronous loop)
  decoupled_ppo  decoupled PPO (Hilton et al. 2021, as used by AReaL): the clipped ratio
                 is pi_theta / pi_prox, and each token's loss is weighted by the
                 behaviour importance weight w_t = pi_prox(y_t) / mu(y_t); tokens whose
                 w_t exceeds `importance_cap` are left out of the loss (weight 0)
  tis            truncated importance sampling (Yao et al. 2025): the same decoupled
                 ratio with the weight truncated, min(w_t, importance_cap)

With either correction the learner computes pi_prox itself (one extra forward pass per
batch) and the clip keeps the update near pi_prox, not near a stale mu. All functions
are pure jnp on [B, T] arrays; `mask` is 1 on scored completion tokens.
"""

from __future__ import annotations

import jax.numpy as jnp

OFF_POLICY = ("none", "decoupled_ppo", "tis")


def importance_weights(prox_logprobs, behaviour_logprobs, mask):
  """float32[B, T]: w_t = exp(log pi_prox - log mu) on masked tokens, 1 elsewhere."""
  m = mask.astype(bool)
  log_w = (prox_logprobs.astype(jnp.float32) - behaviour_logprobs.astype(jnp.float32))
  return jnp.where(m, jnp.exp(jnp.where(m, log_w, 0.0)), 1.0)


def applied_weights(kind: str, weights, mask, *, cap: float):
  """float32[B, T]: the factor each token's policy loss is multiplied by under `kind`
  (1 for "none"; see the module docstring), 0 off the mask."""
  m = mask.astype(jnp.float32)
  if kind == "none":
    return m
  if kind == "decoupled_ppo":
    return jnp.where(weights > cap, 0.0, weights) * m
  if kind == "tis":
    return jnp.minimum(weights, cap) * m
  raise ValueError(f"config.rl.off_policy = {kind!r}: expected one of {list(OFF_POLICY)}")


def weight_stats(kind: str, weights, mask, *, cap: float) -> dict:
  """The importance-weight distribution over masked tokens: mean, min, max of w_t, and
  the fraction of tokens the cap changed (dropped or truncated)."""
  m = mask.astype(bool)
  n = jnp.maximum(m.sum(), 1)
  w = weights.astype(jnp.float32)
  return {"iw_mean": jnp.where(m, w, 0.0).sum() / n,
          "iw_min": jnp.where(m, w, jnp.inf).min(),
          "iw_max": jnp.where(m, w, -jnp.inf).max(),
          "iw_capped_frac": (m & (w > cap)).sum() / n if kind != "none" else jnp.zeros(())}
