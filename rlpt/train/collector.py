"""The collector: the first stage of an RL step, from the mixer's tasks to one
immutable RolloutBatch.

    collector = Collector(settings, mixer, engine, pad_id=tokenizer.pad_token_id)
    key, batch = collector.collect(key)

One call draws `prompts_per_step` tasks, samples `n` completions of each from any
`RolloutEngine` (the embedded JaxEngine or the Fleet; one seed per prompt, drawn from
`key`) and verifies every completion with its domain's verifier (rlpt.rewards), both
through the round scheduler (rlpt.train.scheduler: transient failures retried,
deterministic ones dead-lettered and replaced by new prompts), shapes
the rewards once (`shaped_rewards`: DAPO's overlong punishment) and, with DAPO's
dynamic sampling, drops groups whose rewards are all equal and refills with new
prompts (up to `max_refill_rounds` extra rounds). The batch holds every rollout the
step made, which of them the learner trains, and the learner's row arrays.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np

from rlpt.algorithms import dapo
from rlpt.data.mixer import DomainMixer
from rlpt.rollout.engine import RolloutEngine
from rlpt.train.batch import RolloutBatch, pack_rows
from rlpt.train.scheduler import Round, Scheduler
from rlpt.train.settings import OverlongShaping, Settings
from rlpt.types import Rollout


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


def make_scheduler(settings: Settings, mixer: DomainMixer, engine: RolloutEngine) -> Scheduler:
  """The run's round scheduler over `engine`, the mixer's task sources and the
  engine's tokenizer."""
  sched = Scheduler(settings.scheduler, engine, mixer.sources,
                    getattr(engine, "tokenizer", None), reward_config=settings.rewards,
                    max_prompt_len=settings.rollout.max_prompt_len, episodes=settings.episodes)
  if jax.process_count() > 1:   # each process runs its share of a round's groups
    from rlpt.train.process_rounds import ProcessShardedScheduler
    return ProcessShardedScheduler(sched)
  return sched


def round_outputs(rnd: Round, overlong: OverlongShaping
                  ) -> tuple[list[Rollout], np.ndarray, list, list]:
  """A scheduler round as the collectors keep it: its verified rollouts (group by
  group), their shaped rewards, the retried attempts and the dead-lettered records
  ((rollout, reason) pairs)."""
  rollouts = [r for _, g in rnd.groups for r in g]
  dead = [(r, f"{d.kind}: {d.reason}") for d in rnd.dead for r in d.rollouts]
  return rollouts, shaped_rewards(rollouts, overlong), list(rnd.retried), dead


class Collector:
  """Generates and verifies one step's groups; see the module docstring."""

  def __init__(self, settings: Settings, mixer: DomainMixer, engine: RolloutEngine, *,
               pad_id: int, scheduler: Scheduler | None = None):
    self.settings = settings
    self.mixer = mixer
    self.engine = engine
    self.pad_id = int(pad_id)
    self.sampling = settings.rollout.sampling()
    self.scheduler = scheduler or make_scheduler(settings, mixer, engine)

  def _round(self, key, count: int, first_group: int):
    """Samples `count` new prompts and runs them through the scheduler: (key, Round);
    dead-lettered tasks leave the mixer."""
    tasks = self.mixer.sample(count)
    key, seeds = step_seeds(key, count)
    rnd = self.scheduler.run(tasks, seeds, n=self.settings.rollout.n, sampling=self.sampling,
                             first_group=first_group)
    for d in rnd.dead:
      self.mixer.exclude(d.task)
    return key, rnd

  def collect(self, key: jax.Array) -> tuple[jax.Array, RolloutBatch]:
    """One step's batch (and the key advanced past the seeds it drew). Without dynamic
    sampling one round of prompts_per_step prompts; groups the scheduler dead-letters
    are replaced by new prompts (as dynamic sampling refills filtered groups), within
    the same `max_refill_rounds` budget."""
    s = self.settings
    n, G = s.rollout.n, s.data.prompts_per_step
    every: list[Rollout] = []
    rewards: list[np.ndarray] = []
    retried: list = []
    dead: list = []
    t_gen = t_ver = 0.0
    next_group = rounds = 0
    # fresh per step: no surplus outlives a checkpoint
    sampler = dapo.DynamicSampler(G, n) if s.rl.dynamic_sampling else None
    while rounds <= s.rl.max_refill_rounds:
      held = sampler.held if sampler is not None else len(every) // n
      if held >= G:
        break
      need = (math.ceil((G - held) * s.rl.oversample) if sampler is not None else G - held)
      key, rnd = self._round(key, need, next_group)
      next_group += need
      rs, r, rt, dd = round_outputs(rnd, s.rl.overlong)
      first = len(every)
      every += rs
      rewards.append(r)
      retried += rt
      dead += dd
      t_gen, t_ver = t_gen + rnd.seconds_generate, t_ver + rnd.seconds_verify
      if sampler is not None:
        sampler.add(r, [range(first + g * n, first + (g + 1) * n)
                        for g in range(len(rnd.groups))])
      rounds += 1
    if sampler is not None:
      _, kept = sampler.take(allow_partial=True)
      trained = np.array([i for g in kept for i in g], np.int64)
    else:
      trained = np.arange(len(every), dtype=np.int64)
    shaped = (np.concatenate(rewards).astype(np.float32) if rewards
              else np.zeros((0,), np.float32))
    shaped.setflags(write=False)
    trained.setflags(write=False)
    rows = pack_rows([every[i] for i in trained], shaped[trained], pad_id=self.pad_id,
                     length_multiple=s.rl.length_multiple, rows=s.learner_rows(len(trained)))
    return key, RolloutBatch(rollouts=tuple(every), rewards=shaped, trained=trained, rows=rows,
                             group_size=n, dropped_groups=sampler.dropped if sampler else 0,
                             seconds_generate=t_gen, seconds_verify=t_ver,
                             retried=tuple(retried), dead=tuple(dead))
