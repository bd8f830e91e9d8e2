"""The collector's host side: requests, rollouts, reward shaping, and the batch it
hands to the learner (row arrays, trained rows, per-rollout values)."""

import numpy as np
import pytest

from rlpt.rollout.engine import Completion, SamplingParams
from rlpt.train import collector as col
from rlpt.train import scheduler as sched
from rlpt.train.batch import RolloutBatch, pack_rows
from rlpt.train.settings import OverlongShaping
from rlpt.types import RewardResult, Task


def _tasks():
  return [Task("synthetic", "4=", "4"), Task("math", "1+1?", "2")]


def test_requests_are_chat_formatted_and_seeded():
  reqs = sched.requests_for(_tasks(), n=3, sampling=SamplingParams(max_new_tokens=5), seeds=[7, 9])
  assert [r.n for r in reqs] == [3, 3]
  assert reqs[0].messages == ({"role": "user", "content": "4="},) == _tasks()[0].messages()
  assert [r.sampling.seed for r in reqs] == [7, 9] and reqs[1].sampling.max_new_tokens == 5


def _comp(i, toks, version=3):
  return Completion(request_id="r", sample_index=i, prompt_ids=[1, 5, 6], token_ids=toks,
                    text="x" * len(toks), logprobs=[-0.5] * len(toks),
                    sampling_logprobs=[-0.5] * len(toks), finish_reason="stop",
                    weight_version=version)


def _rollouts():
  comps = [_comp(0, [7, 2]), _comp(1, [8]), _comp(0, [9, 9, 2]), _comp(1, [2])]
  rs = sched.to_rollouts(_tasks(), comps, n=2, first_group=4)
  for r, v in zip(rs, [1.0, 0.0, 0.5, 0.25]):
    r.reward = RewardResult(score=v, reward=v - 0.1)
  return rs


def test_rollouts_pack_into_frozen_rows():
  rs = _rollouts()
  assert [r.group_id for r in rs] == [4, 4, 5, 5] and rs[2].task.domain == "math"
  rewards = col.shaped_rewards(rs, OverlongShaping())
  np.testing.assert_allclose(rewards, [0.9, -0.1, 0.4, 0.15], rtol=1e-6)
  arr = pack_rows(rs, rewards, pad_id=0, length_multiple=8)
  assert arr.tokens.shape == (4, 8)
  assert arr.tokens[2].tolist() == [1, 5, 6, 9, 9, 2, 0, 0]
  assert arr.loss_mask[2].tolist() == [False] * 3 + [True] * 3 + [False] * 2
  assert arr.attention_mask[1].sum() == 4
  np.testing.assert_allclose(arr.old_logprobs[0], [0, 0, 0, -0.5, -0.5, 0, 0, 0])
  np.testing.assert_allclose(arr.rewards, rewards)
  assert arr.group_ids.tolist() == [4, 4, 5, 5]
  with pytest.raises(ValueError, match="read-only"):
    arr.tokens[0, 0] = 3
  padded = pack_rows(rs[:3], rewards[:3], pad_id=0, length_multiple=8, rows=4)
  assert padded.tokens.shape == (4, 8) and not padded.loss_mask[3].any()
  assert padded.attention_mask[3].tolist() == [True] + [False] * 7
  assert padded.rewards[3] == 0 and padded.group_ids[3] == -1


def test_overlong_shaping_is_applied_once_to_the_completion_length():
  rs = _rollouts()  # completion lengths 2, 1, 3, 1
  shaped = col.shaped_rewards(rs, OverlongShaping(buffer=2, penalty=1.0, max_len=3))
  # ramp over the last 2 of 3 tokens: length 2 -> -0.5, length 3 -> -1.0
  np.testing.assert_allclose(shaped, [0.9 - 0.5, -0.1, 0.4 - 1.0, 0.15], rtol=1e-6)


def test_batch_places_per_row_values_and_metrics():
  rs = _rollouts()
  rs[1].finish_reason = "time"  # cut by rollout.max_wall_s: trained like any, counted
  rewards = col.shaped_rewards(rs, OverlongShaping())
  trained = np.array([2, 3])
  batch = RolloutBatch(rollouts=tuple(rs), rewards=rewards, trained=trained,
                       rows=pack_rows([rs[i] for i in trained], rewards[trained], pad_id=0,
                                      rows=4), group_size=2, dropped_groups=1)
  got = batch.per_rollout(np.array([0.5, -0.5]))
  np.testing.assert_array_equal(np.isnan(got), [True, True, False, False])
  np.testing.assert_allclose(got[2:], [0.5, -0.5])
  m = batch.metrics()
  assert m["reward_mean/math"] == pytest.approx(0.275)
  assert m["reward_mean/synthetic"] == pytest.approx(0.4) and m["dropped_groups"] == 1
  assert m["wall_capped"] == 1
  # lengths 2, 1, 3, 1 at scores 1, 0, 0.5, 0.25: only the first has full marks
  assert (m["response_len/correct"], m["response_len/incorrect"]) == (2.0, pytest.approx(5 / 3))
  assert batch.weight_versions().tolist() == [3, 3, 3, 3]


def test_count_and_logprob_mismatches_are_errors():
  with pytest.raises(ValueError, match="3 completions for 2 prompts x n=2"):
    sched.to_rollouts(_tasks(), [_comp(0, [1])] * 3, n=2)
  rs = sched.to_rollouts(_tasks()[:1], [_comp(0, [7, 2])], n=1)
  rs[0].logprobs = [-1.0]
  with pytest.raises(ValueError, match="rollout 0: 1 logprobs for 2 completion tokens"):
    pack_rows(rs, np.zeros(1), pad_id=0)


class _ConstEngine:
  """Answers every sample with the same text: every group has zero reward variance, so
  dynamic sampling drops each one and refills (the RolloutEngine surface: generate)."""

  def __init__(self):
    self.prompts_per_call = []

  def generate(self, requests):
    self.prompts_per_call.append(len(requests))
    return [Completion(request_id=r.request_id, sample_index=i, prompt_ids=[1, 2],
                       token_ids=[5, 2], text="7", logprobs=[-0.1, -0.1],
                       sampling_logprobs=[-0.1, -0.1], finish_reason="stop", weight_version=0)
            for r in requests for i in range(r.n)]


@pytest.mark.parametrize("oversample, want", [(1.0, [4, 4, 4]), (2.5, [10, 10, 10])])
def test_refill_rounds_draw_oversample_times_the_missing_groups(oversample, want):
  import jax
  from configs import smoke
  from rlpt.data import mixer as mixer_lib
  from rlpt.train import build
  from rlpt.train.settings import Settings
  c = smoke.get_config()
  c.data.prompts_per_step, c.rollout.n = 4, 2
  c.rl.dynamic_sampling, c.rl.max_refill_rounds = True, 2
  c.rl.dynamic_sampling_oversample = oversample
  s = Settings.from_config(c)
  weights = dict(s.data.domains)
  sources = {d: build.task_source(d, s.data, seed=0) for d in weights}
  mixer = mixer_lib.DomainMixer(sources, weights, seed=0)
  engine = _ConstEngine()
  _, batch = col.Collector(s, mixer, engine, pad_id=0).collect(jax.random.key(0))
  assert engine.prompts_per_call == want
  assert batch.num_trained == 0 and batch.dropped_groups == sum(want)
  assert len(batch.rollouts) == 2 * sum(want)


@pytest.mark.parametrize("mesh, mbs, want", [
    ({}, 8, {0: 8, 1: 8, 8: 8, 9: 16, 16: 16, 17: 32, 32: 32}),
    ({}, 16, {1: 8, 9: 16, 17: 32}),        # 8 < 16: one microbatch of 8 rows
    ({"data": 2}, 8, {1: 16, 16: 16, 17: 32}),  # 2 devices: whole groups on each
    ({"data": 8}, 8, {1: 64, 32: 64}),      # 64 rows / 8 devices: no smaller share
])
def test_learner_rows_shrink_to_the_trained_groups(mesh, mbs, want):
  """A step pads its trained rows to the fewest of rows, rows/2, ... that keep whole
  groups, whole microbatches and whole groups per batch device, not always to
  prompts_per_step x n."""
  from configs import smoke
  from rlpt.train.settings import Settings
  c = smoke.get_config()
  c.data.prompts_per_step, c.rollout.n, c.rl.microbatch_size = 4, 8, mbs
  if mesh.get("data", 1) > 4:
    c.data.prompts_per_step = 8
  c.mesh = mesh
  s = Settings.from_config(c)
  assert {k: s.learner_rows(k) for k in want} == want
