"""The "python_tool" task source: arithmetic a 135M model cannot do in its head.

Each task is one two-operation expression over 3-4 digit numbers with one product,
e.g. 4821 * 37 - 905, asked in one of several phrasings (symbols or words), so
calling the tool means translating the question into Python, not copying it:

  Task(domain="python_tool", prompt="Subtract 905 from 4821 times 37. What do you get?",
       answer="177472", metadata={"expression": "4821 * 37 - 905"})

Episodes of this domain (rlpt.envs.python_tool) give the model a `python` tool
running in the sandbox; the final `<answer>` is verified as an exact integer
(rlpt.rewards.arithmetic). `reference(task)` is the bare answer turn (what the
verifier scores 1); the whole tool-using episode the SFT warm-up imitates is
rlpt.envs.python_tool.demonstration (it needs the tool-call format).
Train and holdout are split by prompt hash (rlpt.data.sources.splits).

`warmup(index)` draws the SFT warm-up's tasks (rlpt.train.sft): the same
expressions, always asked as "Compute EXPRESSION.", so the warm-up teaches the
tool-call format and the answer, while the phrasings in words (seven of the nine
forms of train and holdout) are left for RL to learn to translate.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlpt.data.sources import splits
from rlpt.types import Task

# (prompt template, expression template); {a} 3-4 digits, {b} 2-3 digits, {c} 3-4 digits.
# Most say the operations in words, in an order or grouping the expression does not
# follow (the subtrahend first, a sum to be multiplied), so the translation is the
# skill; two are written as expressions already.
FORMS = (
    ("Compute {a} * {b} + {c}.", "{a} * {b} + {c}"),
    ("What is {a} times {b}, minus {c}?", "{a} * {b} - {c}"),
    ("Subtract {c} from {a} times {b}. What do you get?", "{a} * {b} - {c}"),
    ("What is {c} plus the product of {a} and {b}?", "{c} + {a} * {b}"),
    ("Add {c} to {a}, then multiply the sum by {b}. What is the result?", "({a} + {c}) * {b}"),
    ("What is {b} times the difference of {a} and {c}?", "{b} * ({a} - {c})"),
    ("Take {c} away from the product of {a} and {b}. What is left?", "{a} * {b} - {c}"),
    ("Multiply the sum of {a} and {c} by {b}.", "({a} + {c}) * {b}"),
    ("Compute ({a} - {c}) * {b}.", "({a} - {c}) * {b}"),
)


@dataclasses.dataclass(frozen=True)
class PythonToolSource(splits.GeneratedSource):
  """Seeded, index-addressed "python_tool" tasks (module docstring)."""

  seed: int = 0
  domain: str = "python_tool"

  def _make(self, rng) -> Task:
    prompt_t, expr_t = FORMS[int(rng.integers(len(FORMS)))]
    a = int(rng.integers(100, 10_000))
    b = int(rng.integers(11, 1_000))
    c = int(rng.integers(100, 10_000))
    expr = expr_t.format(a=a, b=b, c=c)
    answer = eval(expr, {"__builtins__": {}})  # noqa: S307 -- our own integer expression
    return Task(self.domain, prompt_t.format(a=a, b=b, c=c), answer=str(answer),
                metadata={"expression": expr})

  def warmup(self, index: int) -> Task:
    """SFT warm-up task `index` (module docstring): a train task's expression,
    phrased symbolically; never a holdout prompt."""
    splits.check_index(self.domain, index)
    rng = np.random.default_rng([self.seed, 2, index])
    while True:
      t = self._make(rng)
      prompt = f"Compute {t.metadata['expression']}."
      if not splits.is_holdout(prompt) and not splits.is_holdout(t.prompt):
        return Task(self.domain, prompt, answer=t.answer, metadata=dict(t.metadata))

  def reference(self, task: Task) -> str:
    return f"<answer>{task.answer}</answer>"
