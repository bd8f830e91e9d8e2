"""The "code_repair" verifier: HumanEval's hidden tests on an episode's final solution.py.

What it scores is the final state the environment read back from the episode's
sandbox (rlpt.envs.code_repair.final_state), a JSON object:

  {"solution": <solution.py's text, or null when the agent deleted it>,
   "tests_intact": <test_solution.py is still there, byte for byte as given>}

Score 1 when the tests are intact and every assert of the problem's full HumanEval
test passes on the final solution.py (run by the "code" verifier: in the gVisor
sandbox, in a harness the candidate cannot reach; rlpt.rewards.code_verifier),
else 0. Edited or deleted tests score 0 whatever the solution does, with the
violation "tests_modified"; a deleted solution.py scores 0 ("no_solution"). Text
that is not such an object (a single-turn completion) is a "format" 0. A sandbox
that could not run the tests raises (no verdict exists; never a score).
"""

from __future__ import annotations

import dataclasses
import json

from rlpt.rewards.code_verifier import CodeVerifier, sandbox_capacity
from rlpt.rewards.registry import Verifier
from rlpt.types import RewardResult, Task


def final_state(solution: str | None, tests_intact: bool) -> str:
  """The text this verifier scores (what CodeRepairEnv.completion returns)."""
  return json.dumps({"solution": solution, "tests_intact": bool(tests_intact)})


@dataclasses.dataclass
class RepairVerifier(Verifier):
  """Scores a code_repair final state (module docstring); `tests` runs the hidden tests."""

  tests: CodeVerifier = dataclasses.field(default_factory=CodeVerifier)
  isolation: str = "inline"
  timeout_s: float | None = 25.0   # the hidden tests' sandbox deadline (20 s) and margin
  needs_prompt: bool = False

  def capacity(self):
    return sandbox_capacity("code_repair verifier")

  def verify(self, task: Task, completion: str) -> RewardResult:
    try:
      state = json.loads(completion)
    except (TypeError, json.JSONDecodeError):
      state = None
    if (not isinstance(state, dict) or not isinstance(state.get("tests_intact"), bool)
        or not isinstance(state.get("solution"), (str, type(None)))):
      return RewardResult(0.0, ("format",), details={
          "reason": "not a code_repair final state {\"solution\", \"tests_intact\"}"})
    if not state["tests_intact"]:
      return RewardResult(0.0, ("tests_modified",), details={"reason": "the tests were edited "
                                                                        "or deleted"})
    if state["solution"] is None:
      return RewardResult(0.0, ("no_solution",), details={"reason": "solution.py was deleted"})
    return self.tests.verify_code(task, state["solution"])
