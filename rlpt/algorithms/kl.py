"""KL(pi || pi_ref) estimators from per-token log-probabilities (Schulman, "Approximating
KL Divergence", 2020), and where the penalty goes: into the loss or into the reward.

With samples y_t ~ pi and log r_t = log pi_ref(y_t) - log pi(y_t):

    k1 = -log r                   unbiased, high variance, can be negative
    k2 = (log r)^2 / 2            biased, low variance, >= 0
    k3 = (r - 1) - log r          unbiased, low variance, >= 0   (GRPO's choice)

All take logprobs, ref_logprobs: float[B, T] and return float32[B, T] (unmasked).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlpt.algorithms.registry import Registry

KL_ESTIMATORS = Registry("KL estimator (config.rl.kl_estimator)")
KL_PLACEMENTS = ("loss", "reward")


@KL_ESTIMATORS.register("k1")
def k1(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """k1 = log pi(y_t) - log pi_ref(y_t)."""
  return (logprobs - ref_logprobs).astype(jnp.float32)


@KL_ESTIMATORS.register("k2")
def k2(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """k2 = (log pi(y_t) - log pi_ref(y_t))^2 / 2."""
  d = (logprobs - ref_logprobs).astype(jnp.float32)
  return 0.5 * d * d


@KL_ESTIMATORS.register("k3")
def k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """k3 = exp(log r) - 1 - log r with log r = log pi_ref(y_t) - log pi(y_t)."""
  log_r = (ref_logprobs - logprobs).astype(jnp.float32)
  return jnp.expm1(log_r) - log_r


def kl_estimate(name: str, logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """KL_ESTIMATORS[name](logprobs, ref_logprobs): float32[B, T]."""
  return KL_ESTIMATORS.get(name)(logprobs, ref_logprobs)


def penalize_rewards(token_rewards: jax.Array, kl_tok: jax.Array, mask: jax.Array,
                     coef: float) -> jax.Array:
  """KL in the reward (InstructGPT, REINFORCE++, PPO-RLHF): r_t - coef * kl_t on valid
  tokens. token_rewards, kl_tok, mask: [B, T]. kl_tok is treated as a constant."""
  kl = jax.lax.stop_gradient(kl_tok).astype(jnp.float32)
  return token_rewards.astype(jnp.float32) - coef * kl * mask.astype(jnp.float32)
