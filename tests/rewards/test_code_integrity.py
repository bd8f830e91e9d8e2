"""The code verifier pays for solutions, not stubs: all 164 HumanEval problems in the
real gVisor sandbox. Before, a `pass` / `return None` body earned 0.33-0.67 on
HumanEval/12, /52, /56 and /61 (assertions like `assert not candidate(")(")` hold
for None), and 40 of 164 wrong programs scored above 0."""

import pytest

from rlpt import rewards
from rlpt.data.sources import code_tasks
from rlpt.rewards import code_verifier
from rlpt.types import Task

STUB_PAID_BEFORE = ("HumanEval/12", "HumanEval/52", "HumanEval/56", "HumanEval/61")


def _tasks():
  return [code_tasks._task(p, "audit") for p in code_tasks.problems()]


def _stub(task: Task, body: str) -> str:
  return "```python\n" + task.metadata["test_prelude"] + "    " + body + "\n```"


@pytest.fixture(scope="module")
def scored():
  tasks = _tasks()
  src = code_tasks.CodeSource()
  canonical = [src.reference(t) for t in tasks]
  # each problem given the next problem's canonical solution: never the asked function
  wrong = canonical[1:] + canonical[:1]
  results = rewards.compute_rewards(tasks + tasks, canonical + wrong)
  return tasks, results[:len(tasks)], results[len(tasks):]


def test_all_canonical_solutions_score_one(scored):
  tasks, canonical, _ = scored
  assert len(tasks) == 164
  bad = [(t.metadata["task_id"], r.score, r.details) for t, r in zip(tasks, canonical)
         if r.score != 1.0]
  assert not bad, bad


def test_a_wrong_function_scores_zero_everywhere(scored):
  tasks, _, wrong = scored
  paid = [(t.metadata["task_id"], r.score) for t, r in zip(tasks, wrong) if r.score > 0]
  assert not paid, paid


@pytest.mark.parametrize("scoring", ["all", "fraction"])
def test_stub_bodies_earn_nothing(scoring):
  by_id = {t.metadata["task_id"]: t for t in _tasks()}
  rewards.register("test/code_integrity", code_verifier.CodeVerifier(scoring=scoring))
  try:
    tasks, comps = [], []
    for tid in STUB_PAID_BEFORE:
      t = by_id[tid]
      t = Task("test/code_integrity", t.prompt, t.answer, t.metadata)
      for body in ("pass", "return None", "return True", "return 0"):
        tasks.append(t)
        comps.append(_stub(t, body))
      tasks.append(t)
      comps.append(code_tasks.CodeSource().reference(by_id[tid]))
    results = rewards.compute_rewards(tasks, comps)
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/code_integrity")
  for k, tid in enumerate(STUB_PAID_BEFORE):
    group = results[5 * k:5 * k + 5]
    assert [r.score for r in group[:4]] == [0.0] * 4, (tid, [r.details for r in group[:4]])
    assert group[4].score == 1.0, (tid, group[4].details)
    if scoring == "fraction":  # the asserts a constant passes are neither paid nor counted
      d = group[4].details
      assert d["free_asserts"] >= 1 and d["informative"] < d["total"], (tid, d)


def test_fraction_credits_only_informative_asserts():
  """HumanEval/12 (longest): `candidate([]) == None` holds for a null body; an
  implementation right on everything but that assert still gets full credit for the
  rest, and the free assert is not in its denominator."""
  t = next(t for t in _tasks() if t.metadata["task_id"] == "HumanEval/12")
  v = code_verifier.CodeVerifier(scoring="fraction")
  free = v.free_lines(t)
  assert free, "the null implementations pass some assert of HumanEval/12"
  body = ("if not strings:\n        return 'wrong'\n"
          "    return max(strings, key=len)")
  r = v.verify(t, _stub(t, body))
  assert r.score == 1.0 and r.details["passed"] < r.details["total"], r.details
  assert v.free_lines(t) is free  # cached per problem


def test_a_sandbox_that_cannot_run_raises():
  """An infrastructure failure is never a score: without runsc, compute_reward raises
  (a fresh process: the pool in this one is already running)."""
  import subprocess
  import sys
  code = ("from rlpt import rewards\nfrom rlpt.data.sources import code_tasks\n"
          "src = code_tasks.CodeSource()\nt = src.train(0)\n"
          "try:\n  r = rewards.compute_reward(t, src.reference(t))\n  print('SCORED', r)\n"
          "except rewards.VerifierUnavailable as e:\n  print('RAISED', e)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "RLPT_RUNSC": "/nonexistent/runsc"})
  assert "RAISED code verifier: the sandbox could not run" in out.stdout, out.stdout + out.stderr
