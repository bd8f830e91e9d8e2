"""Rollouts of a multi-process run: each process generates and verifies its share of a
round's groups with its own engine, and every process gets the whole round.

    scheduler = ProcessShardedScheduler(Scheduler(...))   # same `run` as a Scheduler
    rnd = scheduler.run(tasks, seeds, n=8, sampling=sp, first_group=g0)

Process p takes the contiguous block `distributed.shard_bounds(len(tasks))` of the
groups (their seeds and group ids are what one process would give them), runs it
through its own Scheduler (its engine, its verifiers, retries and dead letters as
usual), then the rounds are exchanged (`distributed.allgather_objects`) and merged in
group order. Every process so holds the same Round, and the collector, the mixer and
the learner above it run the same program in every process.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable, Sequence

from rlpt.train import distributed
from rlpt.train.scheduler import Round, Scheduler


def merge_rounds(rounds: Sequence[Round]) -> Round:
  """One Round from the processes' rounds: groups and dead letters in group order,
  retried attempts in process order, the slowest process's seconds, summed counts."""
  counts: collections.Counter = collections.Counter()
  for r in rounds:
    counts.update(r.counts)
  return Round(groups=sorted((g for r in rounds for g in r.groups), key=lambda g: g[0]),
               dead=sorted((d for r in rounds for d in r.dead), key=lambda d: d.group_id),
               retried=[x for r in rounds for x in r.retried],
               seconds_generate=max((r.seconds_generate for r in rounds), default=0.0),
               seconds_verify=max((r.seconds_verify for r in rounds), default=0.0),
               counts=counts)


class ProcessShardedScheduler:
  """A Scheduler whose rounds are split over the job's processes (module docstring)."""

  def __init__(self, inner: Scheduler):
    self.inner = inner

  def __getattr__(self, name: str) -> Any:
    return getattr(self.inner, name)

  def run(self, tasks: Sequence[Any], seeds: Sequence[int], *, n: int, sampling: Any,
          first_group: int, generating: Callable[[], Any] = contextlib.nullcontext) -> Round:
    lo, hi = distributed.shard_bounds(len(tasks))
    mine = (self.inner.run(list(tasks[lo:hi]), list(seeds[lo:hi]), n=n, sampling=sampling,
                           first_group=first_group + lo, generating=generating)
            if hi > lo else Round([], [], []))
    return merge_rounds(distributed.allgather_objects(mine))
