"""DAPO's batch-level pieces (Yu et al. 2025): dynamic sampling and overlong reward
shaping.

Dynamic sampling runs on the host between verification and the update: groups whose
n rewards are all equal carry zero group-relative advantage (no gradient), so they are
dropped and more prompts are sampled until the batch holds the wanted number of
groups:

    sampler = DynamicSampler(target_groups=8, group_size=4)
    while not sampler.full and rounds <= max_refill_rounds:
      rewards, groups = generate_and_verify(...)   # rewards: float[G*n]
      sampler.add(rewards, groups)
    rewards, groups = sampler.take()               # exactly target_groups groups
"""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np


def nonzero_variance_groups(rewards, group_size: int, *, atol: float = 0.0) -> np.ndarray:
  """bool[G]: True for groups whose rewards are not all equal (max - min > atol).

  rewards: float[G*n], laid out group by group.
  """
  r = np.asarray(rewards, dtype=np.float64)
  if group_size < 1 or r.ndim != 1 or r.shape[0] % group_size:
    raise ValueError(f"rewards of shape {r.shape} is not a whole number of groups "
                     f"of {group_size}")
  g = r.reshape(-1, group_size)
  return (g.max(axis=1) - g.min(axis=1)) > atol


class DynamicSampler:
  """Collects groups with reward variance until `target_groups` are held.

  Groups are kept in arrival order; `take()` returns the first `target_groups` and
  keeps any surplus for the next batch. `dropped` counts groups filtered out.
  """

  def __init__(self, target_groups: int, group_size: int):
    if target_groups < 1 or group_size < 2:
      raise ValueError(f"DynamicSampler needs target_groups >= 1 and group_size >= 2, "
                       f"got {target_groups}, {group_size}")
    self.target_groups = target_groups
    self.group_size = group_size
    self._rewards: list[np.ndarray] = []
    self._payloads: list[Any] = []
    self.dropped = 0

  @property
  def held(self) -> int:
    return len(self._payloads)

  @property
  def full(self) -> bool:
    return self.held >= self.target_groups

  def add(self, rewards, groups: Sequence[Any]) -> int:
    """Adds G groups (`groups[g]` is any payload of group g; rewards: float[G*n]).
    Returns how many were kept."""
    keep = nonzero_variance_groups(rewards, self.group_size)
    if len(groups) != keep.shape[0]:
      raise ValueError(f"{len(groups)} group payloads for {keep.shape[0]} reward groups")
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, self.group_size)
    for k, rg, payload in zip(keep, r, groups):
      if k:
        self._rewards.append(rg)
        self._payloads.append(payload)
      else:
        self.dropped += 1
    return int(keep.sum())

  def take(self, *, allow_partial: bool = False) -> tuple[np.ndarray, list[Any]]:
    """(rewards float[K*n], payloads[K]) with K = target_groups (or fewer when
    allow_partial, after the refill budget ran out)."""
    if not self.full and not allow_partial:
      raise RuntimeError(f"DynamicSampler holds {self.held} of {self.target_groups} groups")
    k = min(self.held, self.target_groups)
    rewards = (np.concatenate(self._rewards[:k]) if k
               else np.zeros((0,), np.float64))
    payloads = self._payloads[:k]
    self._rewards, self._payloads = self._rewards[k:], self._payloads[k:]
    return rewards, payloads


def overlong_penalty(lengths, *, max_len: int, buffer: int, penalty: float = 1.0):
  """DAPO's soft overlong punishment (eq. 13), added to the reward:

    0                                   if L <= max_len - buffer
    penalty * ((max_len - buffer) - L) / buffer   if max_len - buffer < L <= max_len
    -penalty                            if L > max_len

  lengths: int[B] response lengths; returns float32[B] (<= 0). buffer = 0 turns it off.
  """
  lengths = jnp.asarray(lengths, jnp.float32)
  if buffer <= 0:
    return jnp.zeros_like(lengths)
  if buffer > max_len:
    raise ValueError(f"overlong buffer {buffer} exceeds max_len {max_len}")
  start = max_len - buffer
  ramp = (start - lengths) / buffer * penalty
  return jnp.where(lengths <= start, 0.0, jnp.where(lengths <= max_len, ramp, -penalty))
