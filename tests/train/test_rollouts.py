"""Host side of an RL step: requests, rollouts, learner arrays, per-domain means."""

import numpy as np
import pytest

from rlpt.rollout.engine import Completion, SamplingParams
from rlpt.train import rollouts as ro
from rlpt.types import RewardResult, Task


def _tasks():
  return [Task("synthetic", "4=", "4"), Task("math", "1+1?", "2")]


def test_requests_are_chat_formatted_and_seeded():
  reqs = ro.make_requests(_tasks(), n=3, sampling=SamplingParams(max_new_tokens=5), seeds=[7, 9])
  assert [r.n for r in reqs] == [3, 3]
  assert reqs[0].messages == ({"role": "user", "content": "4="},)
  assert [r.sampling.seed for r in reqs] == [7, 9] and reqs[1].sampling.max_new_tokens == 5


def _comp(i, toks, version=3):
  return Completion(request_id="r", sample_index=i, prompt_ids=[1, 5, 6], token_ids=toks,
                    text="x" * len(toks), logprobs=[-0.5] * len(toks),
                    sampling_logprobs=[-0.5] * len(toks), finish_reason="stop",
                    weight_version=version)


def test_rollouts_pack_and_means():
  comps = [_comp(0, [7, 2]), _comp(1, [8]), _comp(0, [9, 9, 2]), _comp(1, [2])]
  rs = ro.to_rollouts(_tasks(), comps, n=2, first_group=4)
  assert [r.group_id for r in rs] == [4, 4, 5, 5] and rs[2].task.domain == "math"
  for r, v in zip(rs, [1.0, 0.0, 0.5, 0.25]):
    r.reward = RewardResult(score=v, reward=v - 0.1)
  arr = ro.pack(rs, pad_id=0, length_multiple=8)
  assert arr["tokens"].shape == (4, 8)
  assert arr["tokens"][2].tolist() == [1, 5, 6, 9, 9, 2, 0, 0]
  assert arr["loss_mask"][2].tolist() == [False] * 3 + [True] * 3 + [False] * 2
  assert arr["attention_mask"][1].sum() == 4
  np.testing.assert_allclose(arr["old_logprobs"][0], [0, 0, 0, -0.5, -0.5, 0, 0, 0])
  np.testing.assert_allclose(arr["rewards"], [0.9, -0.1, 0.4, 0.15], rtol=1e-6)
  assert arr["lengths"].tolist() == [2, 1, 3, 1]
  padded = ro.pack(rs[:3], pad_id=0, length_multiple=8, rows=4)
  assert padded["tokens"].shape == (4, 8) and not padded["loss_mask"][3].any()
  assert padded["attention_mask"][3].tolist() == [True] + [False] * 7
  assert padded["rewards"][3] == 0 and padded["lengths"][3] == 0
  assert ro.domain_means(rs) == pytest.approx({"math": 0.275, "synthetic": 0.4})
  assert ro.domain_means(rs, "score") == pytest.approx({"math": 0.375, "synthetic": 0.5})


def test_count_and_logprob_mismatches_are_errors():
  with pytest.raises(ValueError, match="3 completions for 2 prompts x n=2"):
    ro.to_rollouts(_tasks(), [_comp(0, [1])] * 3, n=2)
  rs = ro.to_rollouts(_tasks()[:1], [_comp(0, [7, 2])], n=1)
  rs[0].logprobs = [-1.0]
  with pytest.raises(ValueError, match="rollout 0: 1 logprobs for 2 completion tokens"):
    ro.pack(rs, pad_id=0)
