"""HumanEval task source: all 164 problems, disjoint by task id, seeded order."""

import pytest

from rlpt.data.sources import code_tasks, splits


def test_problems_and_splits():
  probs = code_tasks.problems()
  assert len(probs) == 164
  s = code_tasks.CodeSource(seed=0)
  n_train = sum(1 for p in probs if not splits.is_holdout(p["task_id"]))
  epoch = [s.train(i).metadata["task_id"] for i in range(n_train)]
  assert len(set(epoch)) == n_train  # one pass visits every train problem once
  hold = s.holdout(164 - n_train)
  assert not set(epoch) & {t.metadata["task_id"] for t in hold}
  t = s.train(0)
  assert t.domain == "code" and "def check(candidate)" in t.answer
  assert t.metadata["entry_point"] in t.prompt and "```python" in t.prompt
  assert "def check" not in t.prompt
  assert [s.train(i).metadata["task_id"] for i in range(5)] != \
      [code_tasks.CodeSource(seed=1).train(i).metadata["task_id"] for i in range(5)]
  with pytest.raises(ValueError, match="held-out HumanEval problems"):
    s.holdout(200)
