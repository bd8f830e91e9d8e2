r"""The "math" task source: reasoning-gym's arithmetic and algebra generators.

Each task is `Task(domain="math", prompt=<question + \boxed{} instruction>,
answer=<gold string>)`, verified by math-verify (rlpt.rewards.math_verifier).
Train task `i` takes generator `i mod G` and that generator's train task
`i // G` (see rg_tasks: seeded, held-out questions excluded); the holdout list
interleaves the generators' holdout lists. The generators are those whose gold
is a single number or fraction math-verify parses unambiguously.
"""

from __future__ import annotations

import dataclasses

from rlpt.data.sources import rg_tasks, splits
from rlpt.types import Task

GENERATORS = ("basic_arithmetic", "chain_sum", "decimal_chain_sum", "products", "gcd", "lcm",
              "gsm_symbolic", "fraction_simplification", "simple_equations")
INSTRUCTION = "\n\nPut your final answer in \\boxed{}."


def _gold(answer: str) -> str:
  g = str(answer).strip()
  if len(g) >= 2 and g[0] == g[-1] == "$":
    g = g[1:-1].strip()
  return g


@dataclasses.dataclass(frozen=True)
class MathSource:
  """Seeded, index-addressed "math" tasks.

  Attributes:
    generators: reasoning-gym generators to interleave.
    seed: stream seed.
  """

  generators: tuple[str, ...] = GENERATORS
  seed: int = 0
  domain: str = "math"

  def __post_init__(self):
    known = set(rg_tasks.generators())
    bad = [g for g in self.generators if g not in known]
    if bad or not self.generators:
      raise ValueError(f"math source: unknown reasoning-gym generators {bad} "
                       f"(or none given); e.g. {GENERATORS}")

  def _convert(self, t: Task) -> Task:
    entry = t.metadata["rg_entry"]
    return Task(self.domain, entry["question"] + INSTRUCTION, answer=_gold(entry["answer"]),
                metadata={"generator": t.metadata["generator"], "split": t.metadata["split"]})

  def train(self, index: int) -> Task:
    splits.check_index(self.domain, index)
    g = len(self.generators)
    src = rg_tasks.RGSource(self.generators[index % g], self.seed)
    return self._convert(src.train(index // g))

  def holdout(self, n: int) -> list[Task]:
    g = len(self.generators)
    per = [rg_tasks.RGSource(name, self.seed).holdout(-(-n // g)) for name in self.generators]
    return [self._convert(per[i % g][i // g]) for i in range(n)]

  def reference(self, task: Task) -> str:
    return f"The answer is \\boxed{{{task.answer}}}."
