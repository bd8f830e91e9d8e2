"""How a multi-process run splits a round's groups and merges the processes' rounds
(the 2-process run itself: tests/launch/test_train_multiprocess.py)."""

import collections

import pytest

from rlpt.train import distributed
from rlpt.train.process_rounds import merge_rounds
from rlpt.train.scheduler import DeadLetter, Round
from rlpt.types import Rollout, Task


@pytest.mark.parametrize("count, processes", [(8, 2), (7, 2), (3, 4), (0, 3), (13, 5)])
def test_shard_bounds_cover_every_group_once_in_order(count, processes):
  bounds = [distributed.shard_bounds(count, p, processes) for p in range(processes)]
  assert bounds[0][0] == 0 and bounds[-1][1] == count
  assert all(b[1] == c[0] for b, c in zip(bounds, bounds[1:]))        # contiguous
  sizes = [hi - lo for lo, hi in bounds]
  assert max(sizes) - min(sizes) <= 1


def _rollout(task, g):
  return Rollout(task=task, prompt_ids=[1], completion_ids=[2], completion_text="x",
                 logprobs=[-0.5], weight_version=0, finish_reason="stop", group_id=g)


def test_merged_round_is_in_group_order_with_summed_counts():
  t = Task("synthetic", "p", answer="1")
  a = Round(groups=[(0, [_rollout(t, 0)]), (1, [_rollout(t, 1)])],
            dead=[DeadLetter(t, 2, "prompt_too_long", "long", [])], retried=[],
            seconds_generate=2.0, seconds_verify=1.0,
            counts=collections.Counter(prompt_too_long=1))
  b = Round(groups=[(4, [_rollout(t, 4)]), (3, [_rollout(t, 3)])], dead=[],
            retried=[(_rollout(t, 3), "timeout")], seconds_generate=3.0, seconds_verify=0.5,
            counts=collections.Counter(engine_unavailable=1))
  m = merge_rounds([b, a])
  assert [g for g, _ in m.groups] == [0, 1, 3, 4]
  assert [d.group_id for d in m.dead] == [2] and len(m.retried) == 1
  assert (m.seconds_generate, m.seconds_verify) == (3.0, 1.0)     # the slowest process
  assert m.counts == collections.Counter(prompt_too_long=1, engine_unavailable=1)
