"""Advantage estimators: per-token advantages [B,T] from per-token rewards [B,T].

Every estimator has the same signature

    fn(token_rewards, mask, *, group_size, values=None, gamma=1.0, lam=1.0,
       eps=1e-6) -> advantages float32[B, T]

  token_rewards: float[B, T], the reward of each token; an outcome reward sits on
    the last valid token (see `outcome_token_rewards`), a KL-in-reward penalty is
    spread over all tokens (see rlpt.algorithms.kl.penalize_rewards).
  mask: bool/float[B, T], 1 on the response tokens the loss sees.
  group_size: n, the samples per prompt. Rows are laid out group by group: rows
    [g*n, (g+1)*n) are the n samples of prompt g, so B = G*n.
  values: float[B, T], the value head's estimates (GAE only).

Outcome-level estimators (group_norm, group_mean, rloo) reduce each row to its
return R_b = sum_t token_rewards[b, t] * mask[b, t] and broadcast one advantage
over the row's valid tokens. Outputs are zero where mask is 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlpt.algorithms.registry import Registry

ADVANTAGES = Registry("advantage estimator (config.rl.advantage)")


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """Places the sequence reward on the last valid token of each row.

  rewards: float[B]; mask: [B, T]. Returns float32[B, T] with
  out[b, last_b] = rewards[b], zero elsewhere (all zero for a row with no valid token).
  """
  mask = mask.astype(bool)
  t = mask.shape[1]
  last = t - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  onehot = jax.nn.one_hot(last, t, dtype=jnp.float32) * mask.any(axis=1, keepdims=True)
  return onehot * rewards.astype(jnp.float32)[:, None]


def sequence_returns(token_rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """R_b = sum_t token_rewards[b, t] * mask[b, t]: float32[B]."""
  return jnp.sum(token_rewards.astype(jnp.float32) * mask, axis=1)


def _groups(x: jax.Array, group_size: int) -> jax.Array:
  if group_size < 2:
    raise ValueError(f"group-relative advantages need group_size >= 2, got {group_size}")
  if x.shape[0] % group_size:
    raise ValueError(f"batch of {x.shape[0]} rows is not a whole number of groups "
                     f"of {group_size} (rows must be laid out group by group)")
  return x.reshape(-1, group_size)


def _broadcast(adv_b: jax.Array, mask: jax.Array) -> jax.Array:
  return adv_b[:, None] * mask.astype(jnp.float32)


@ADVANTAGES.register("group_norm")
def group_norm(token_rewards, mask, *, group_size, values=None, gamma=1.0, lam=1.0,
               eps=1e-6):
  """GRPO (Shao et al. 2024, DeepSeekMath): A_b = (R_b - mean_g R) / (std_g R + eps).

  std is the unbiased sample std of the group (ddof=1, as torch.std in TRL/verl).
  A group whose rewards are all equal gets A = 0 for every member.
  """
  del values, gamma, lam
  r = _groups(sequence_returns(token_rewards, mask), group_size)
  mean = r.mean(axis=1, keepdims=True)
  std = jnp.std(r, axis=1, keepdims=True, ddof=1)
  return _broadcast(((r - mean) / (std + eps)).reshape(-1), mask)


@ADVANTAGES.register("group_mean")
def group_mean(token_rewards, mask, *, group_size, values=None, gamma=1.0, lam=1.0,
               eps=1e-6):
  """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_b = R_b - mean_g R.

  No division by the group std, which biases updates toward too-easy/too-hard prompts.
  """
  del values, gamma, lam, eps
  r = _groups(sequence_returns(token_rewards, mask), group_size)
  return _broadcast((r - r.mean(axis=1, keepdims=True)).reshape(-1), mask)


@ADVANTAGES.register("rloo")
def rloo(token_rewards, mask, *, group_size, values=None, gamma=1.0, lam=1.0, eps=1e-6):
  """RLOO (Kool et al. 2019; Ahmadian et al. 2024): leave-one-out baseline.

  A_b = R_b - (sum_{j in g, j != b} R_j) / (n - 1)   (= n/(n-1) * (R_b - mean_g R)).
  """
  del values, gamma, lam, eps
  r = _groups(sequence_returns(token_rewards, mask), group_size)
  baseline = (r.sum(axis=1, keepdims=True) - r) / (group_size - 1)
  return _broadcast((r - baseline).reshape(-1), mask)


def _reverse_scan(step, init, xs):
  """lax.scan over the time axis (axis 1 of [B, T] arrays) from the last token back."""
  xs_t = jax.tree.map(lambda a: jnp.moveaxis(a, 1, 0), xs)
  _, ys = jax.lax.scan(step, init, xs_t, reverse=True)
  return jnp.moveaxis(ys, 0, 1)


def discounted_returns(token_rewards, mask, gamma=1.0):
  """G_t = sum_{s >= t, s valid} gamma^(#valid tokens between t and s) r_s; float32[B, T].

  Invalid (masked) tokens are skipped, not counted as steps; zero where mask is 0.
  """
  m = mask.astype(jnp.float32)
  r = token_rewards.astype(jnp.float32) * m

  def step(carry, x):
    r_t, m_t = x
    g = jnp.where(m_t > 0, r_t + gamma * carry, carry)
    return g, g * m_t

  return _reverse_scan(step, jnp.zeros(r.shape[0], jnp.float32), (r, m))


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(token_rewards, mask, *, group_size, values=None, gamma=1.0, lam=1.0,
                 eps=1e-6):
  """REINFORCE++ (Hu 2025): token returns, normalized over the whole batch.

  G_t = discounted_returns(r, mask, gamma);  A_t = (G_t - mu) / (sigma + eps) where mu,
  sigma are the mean and population std of G over every valid token of the batch.
  With KL in the reward, r_t = -beta * kl_t (+ R on the last token).
  """
  del group_size, values, lam
  m = mask.astype(jnp.float32)
  g = discounted_returns(token_rewards, mask, gamma)
  n = jnp.maximum(m.sum(), 1.0)
  mu = (g * m).sum() / n
  var = (((g - mu) * m) ** 2).sum() / n
  return (g - mu) / (jnp.sqrt(var) + eps) * m


@ADVANTAGES.register("gae")
def gae(token_rewards, mask, *, group_size, values=None, gamma=1.0, lam=1.0, eps=1e-6):
  """GAE (Schulman et al. 2016), for PPO with a value head.

  delta_t = r_t + gamma * V_{t'} - V_t, with t' the next valid token (V = 0 after the
  last one); A_t = delta_t + gamma * lam * A_{t'}. Returns for the value loss are
  A_t + V_t. values: float[B, T] (required).
  """
  del group_size, eps
  if values is None:
    raise ValueError("advantage 'gae' needs values [B, T] from a value head")
  m = mask.astype(jnp.float32)
  r = token_rewards.astype(jnp.float32) * m
  v = values.astype(jnp.float32) * m

  def step(carry, x):
    next_v, next_a = carry
    r_t, v_t, m_t = x
    delta = r_t + gamma * next_v - v_t
    a = delta + gamma * lam * next_a
    valid = m_t > 0
    return (jnp.where(valid, v_t, next_v), jnp.where(valid, a, next_a)), a * m_t

  zeros = jnp.zeros(r.shape[0], jnp.float32)
  return _reverse_scan(step, (zeros, zeros), (r, v, m))


def compute_advantages(name: str, token_rewards, mask, *, group_size: int, values=None,
                       gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6):
  """Looks `name` up in ADVANTAGES and applies it (see the module docstring)."""
  return ADVANTAGES.get(name)(token_rewards, mask, group_size=group_size, values=values,
                              gamma=gamma, lam=lam, eps=eps)
