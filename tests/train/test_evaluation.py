"""Holdout evaluation: one batch of distinct prompts, per-task outcomes and intervals."""

import numpy as np

from rlpt.rollout.engine import Completion
from rlpt.train import evaluation
from rlpt.types import Task


class _RecordingEngine:
  """Answers each prompt with a fixed text and records what it was asked (the
  RolloutEngine surface evaluate uses: generate)."""

  def __init__(self, answers):
    self.answers, self.calls = answers, []

  def generate(self, requests):
    self.calls.append([r.messages[-1]["content"] for r in requests])
    out = []
    for r in requests:
      assert r.sampling.temperature == 0.0 and r.n == 1
      text = self.answers[r.messages[-1]["content"]]
      out.append(Completion(request_id=r.request_id, sample_index=0, prompt_ids=[1],
                            token_ids=[5], text=text, logprobs=[-0.1],
                            sampling_logprobs=[0.0], finish_reason="stop", weight_version=0))
    return out


def test_repeated_tasks_are_decoded_once_and_counted_each_time():
  holdout = {"synthetic": [Task("synthetic", "12=", "12"), Task("synthetic", "7=", "7"),
                           Task("synthetic", "12=", "12"), Task("synthetic", "3=", "3")]}
  engine = _RecordingEngine({"12=": "12", "7=": "9", "3=": "3"})
  ev = evaluation.evaluate(engine, holdout, max_new_tokens=4)
  assert len(engine.calls) == 1 and sorted(engine.calls[0]) == ["12=", "3=", "7="]
  e = ev["synthetic"]
  assert e["correct"] == [1, 0, 1, 1] and e["n"] == 4
  np.testing.assert_allclose(e["accuracy"], 0.75)
  assert e["low"] < 0.75 < e["high"]
  before = dict(e, correct=[0, 0, 1, 1])
  g = evaluation.gain(e, before)
  np.testing.assert_allclose(g.estimate, 0.25)
  assert evaluation.gain(e, {"accuracy": 0.5}) is None  # an evals.json without outcomes
