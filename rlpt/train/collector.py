"""The collector: the first stage of an RL step, from the mixer's tasks to one
immutable RolloutBatch.

    collector = Collector(settings, mixer, engine, pad_id=tokenizer.pad_token_id)
    key, batch = collector.collect(key)

One call draws `prompts_per_step` tasks, samples `n` completions of each from any
`RolloutEngine` (the embedded JaxEngine or the Fleet; one seed per prompt, drawn from
`key`), verifies every completion with its domain's verifier (rlpt.rewards), shapes
the rewards once (`shaped_rewards`: DAPO's overlong punishment) and, with DAPO's
dynamic sampling, drops groups whose rewards are all equal and refills with new
prompts (up to `max_refill_rounds` extra rounds). The batch holds every rollout the
step made, which of them the learner trains, and the learner's row arrays.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import numpy as np

from rlpt.algorithms import dapo
from rlpt.data.mixer import DomainMixer
from rlpt.rollout.engine import Completion, GenerateRequest, RolloutEngine, SamplingParams
from rlpt.train.batch import RolloutBatch, pack_rows
from rlpt.train.settings import OverlongShaping, Settings
from rlpt.types import Rollout, Task


def requests_for(tasks: Sequence[Task], *, n: int, sampling: SamplingParams,
                 seeds: Sequence[int]) -> list[GenerateRequest]:
  """One request per task (its chat messages, `Task.messages`), `n` samples, seeded per
  prompt."""
  return [GenerateRequest(messages=t.messages(), n=n,
                          sampling=dataclasses.replace(sampling, seed=int(s)),
                          request_id=f"{t.domain}:{i}")
          for i, (t, s) in enumerate(zip(tasks, seeds))]


def to_rollouts(tasks: Sequence[Task], completions: Sequence[Completion], *, n: int,
                first_group: int = 0) -> list[Rollout]:
  """Completions (request order, samples in order) -> Rollouts with group ids."""
  if len(completions) != len(tasks) * n:
    raise ValueError(f"engine returned {len(completions)} completions for {len(tasks)} "
                     f"prompts x n={n}")
  out = []
  for j, c in enumerate(completions):
    g = j // n
    out.append(Rollout(task=tasks[g], prompt_ids=list(c.prompt_ids),
                       completion_ids=list(c.token_ids), completion_text=c.text,
                       logprobs=list(c.logprobs), weight_version=c.weight_version,
                       finish_reason=c.finish_reason, group_id=first_group + g))
  return out


def verify(rollouts: Sequence[Rollout], reward_config: Any = None) -> float:
  """Fills `rollout.reward` for every rollout with rlpt.rewards.compute_rewards
  (parallel, per-sample timeouts); returns wall seconds."""
  from rlpt.rewards import registry
  t0 = time.perf_counter()
  results = registry.compute_rewards([r.task for r in rollouts],
                                     [r.completion_text for r in rollouts], config=reward_config)
  for r, res in zip(rollouts, results):
    r.reward = res
  return time.perf_counter() - t0


def shaped_rewards(rollouts: Sequence[Rollout], overlong: OverlongShaping) -> np.ndarray:
  """float32[B]: the verifier's reward plus DAPO's overlong shaping of the completion
  length (when `overlong.buffer` > 0): what dynamic sampling and the learner see."""
  r = np.array([x.reward.reward for x in rollouts], np.float32)
  if overlong.buffer > 0:
    r = r + np.asarray(dapo.overlong_penalty(
        [len(x.completion_ids) for x in rollouts], max_len=overlong.max_len,
        buffer=overlong.buffer, penalty=overlong.penalty))
  return r


def step_seeds(key: jax.Array, count: int) -> tuple[jax.Array, np.ndarray]:
  """(next key, int64[count] per-prompt sampling seeds) drawn from `key`."""
  key, sub = jax.random.split(key)
  return key, np.asarray(jax.random.randint(sub, (count,), 0, 2 ** 31 - 1), np.int64)


class Collector:
  """Generates and verifies one step's groups; see the module docstring."""

  def __init__(self, settings: Settings, mixer: DomainMixer, engine: RolloutEngine, *,
               pad_id: int):
    self.settings = settings
    self.mixer = mixer
    self.engine = engine
    self.pad_id = int(pad_id)
    self.sampling = settings.rollout.sampling()

  def _round(self, key, count: int, first_group: int):
    """Samples and verifies `count` new prompts: (key, rollouts, shaped rewards,
    seconds generating, seconds verifying)."""
    n = self.settings.rollout.n
    tasks = self.mixer.sample(count)
    key, seeds = step_seeds(key, count)
    t0 = time.perf_counter()
    comps = self.engine.generate(requests_for(tasks, n=n, sampling=self.sampling, seeds=seeds))
    t_gen = time.perf_counter() - t0
    rollouts = to_rollouts(tasks, comps, n=n, first_group=first_group)
    t_ver = verify(rollouts, self.settings.rewards)
    return key, rollouts, shaped_rewards(rollouts, self.settings.rl.overlong), t_gen, t_ver

  def collect(self, key: jax.Array) -> tuple[jax.Array, RolloutBatch]:
    """One step's batch (and the key advanced past the seeds it drew)."""
    s = self.settings
    n, G = s.rollout.n, s.data.prompts_per_step
    every: list[Rollout] = []
    rewards: list[np.ndarray] = []
    t_gen = t_ver = 0.0
    dropped = 0
    if not s.rl.dynamic_sampling:
      key, every, r, t_gen, t_ver = self._round(key, G, 0)
      rewards, trained = [r], np.arange(len(every))
    else:
      sampler = dapo.DynamicSampler(G, n)  # fresh per step: no surplus outlives a checkpoint
      rounds = 0
      while not sampler.full and rounds <= s.rl.max_refill_rounds:
        need = math.ceil((G - sampler.held) * s.rl.oversample)
        first = len(every) // n
        key, rs, r, tg, tv = self._round(key, need, first)
        every += rs
        rewards.append(r)
        t_gen, t_ver = t_gen + tg, t_ver + tv
        sampler.add(r, [range((first + g) * n, (first + g + 1) * n) for g in range(need)])
        rounds += 1
      _, kept = sampler.take(allow_partial=True)
      dropped = sampler.dropped
      trained = np.array([i for g in kept for i in g], np.int64)
    shaped = np.concatenate(rewards).astype(np.float32)
    shaped.setflags(write=False)
    trained.setflags(write=False)
    rows = pack_rows([every[i] for i in trained], shaped[trained], pad_id=self.pad_id,
                     length_multiple=s.rl.length_multiple, rows=s.rows)
    return key, RolloutBatch(rollouts=tuple(every), rewards=shaped, trained=trained, rows=rows,
                             group_size=n, dropped_groups=dropped, seconds_generate=t_gen,
                             seconds_verify=t_ver)
