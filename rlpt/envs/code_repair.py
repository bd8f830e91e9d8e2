"""code_repair: fix a planted bug in solution.py by editing, running the tests, reading.

The task names a workspace (rlpt.data.sources.repair_tasks): metadata["files"]
(the buggy `solution.py` and its visible tests `test_solution.py`), which file is
the solution, which files are protected (the tests) and the test command. The
system message lists the tools (write_file, read_file, edit_file, run:
rlpt.envs.sandbox_tools) and the loop; the user message says what is wrong and
shows solution.py. Each assistant turn with tool calls gets their outputs back;
the first turn without a call ends the episode. The final state (`completion()`)
is read back from the sandbox: the solution file's text and whether every
protected file is untouched, which the "code_repair" verifier scores with the
problem's full, hidden HumanEval tests (rlpt.rewards.repair): edited or deleted
tests score 0.

The sandbox session is opened (and the workspace written) at the first tool call,
so an episode that ends at once holds no container; its final state is the files
as given. A session lost to an infrastructure failure raises SessionLost (the
RL step retries the round; never a score).

`demonstration(task)` is the reference agent's episode: run the tests, read the
failure, apply the canonical fix with edit_file, run the tests again, stop. Its
tool outputs are the ones the sandbox gives (the failure text was recorded when
the mutant was built, and tests/envs/test_code_repair.py replays every shipped
one live).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from rlpt.envs import tool_calls
from rlpt.envs.base import EnvStep, Environment
from rlpt.envs.sandbox_tools import SandboxToolEnv, ToolLimits, command_output, describe
from rlpt.rewards.repair import final_state
from rlpt.sandbox import SessionLost
from rlpt.types import Task

TOOLS = ("read_file", "edit_file", "write_file", "run")
DONE = "The tests pass now."
_KEYS = ("files", "solution_file", "protected", "test_command")


def system_message(task: Task, with_tools: bool = True) -> str:
  m = task.metadata
  if not with_tools:
    return f"Answer with the corrected {m['solution_file']} in one ```python block."
  return (f"You fix bugs in Python code. The files are in /sandbox. Tools:\n{describe(TOOLS)}\n"
          "To use a tool, write a tool call:\n"
          + tool_calls.format_call("run", {"command": m["test_command"]}) + "\n"
          "Its output comes back in <tool_response>...</tool_response>. Run the tests, read "
          f"the failure, fix {m['solution_file']}, and run the tests again. Never change "
          f"{', '.join(m['protected'])}. When the tests pass, reply without a tool call.")


class CodeRepairEnv(SandboxToolEnv):
  """One code_repair episode at a time over sandbox sessions from `pool`."""

  tools = TOOLS

  def __init__(self, pool: Any, limits: ToolLimits = ToolLimits(max_calls=8), *,
               with_tool: bool = True, memory_mb: int = 256):
    super().__init__(pool, limits, with_tool=with_tool, memory_mb=memory_mb)
    self._task: Task | None = None

  def reset(self, task: Task) -> list[dict[str, str]]:
    self.close()
    missing = [k for k in _KEYS if k not in task.metadata]
    if missing:
      raise ValueError(f"code_repair: task {task.metadata.get('task_id')!r} lacks metadata "
                       f"{missing} (make it with rlpt.data.sources.repair_tasks)")
    self._task = task
    return [{"role": "system", "content": system_message(task, self.with_tool)},
            {"role": "user", "content": task.prompt}]

  def workspace(self) -> dict[str, str]:
    return dict(self._task.metadata["files"])

  def step(self, text: str) -> EnvStep:
    calls = tool_calls.parse(text, self.tools)
    return self.answer(calls) if calls else EnvStep(done=True)

  def completion(self) -> str:
    """The final state (rlpt.rewards.repair.final_state), read from the sandbox."""
    task = self._task
    if task is None:
      raise RuntimeError("CodeRepairEnv.completion before reset")
    m = task.metadata
    if self._session is None:
      return final_state(m["files"][m["solution_file"]], True)
    spec = {"solution": m["solution_file"], "protected": list(m["protected"]),
            "max_chars": self.limits.max_file_chars}
    r = self._session.run({}, ["python3", "-c", _READ_BACK, json.dumps(spec)], timeout_s=10.0)
    try:
      state = json.loads(r.stdout)
    except json.JSONDecodeError:
      state = None
    if r.status != "ok" or not isinstance(state, dict):
      # The read-back is ours, not the model's: it failing is an infrastructure failure.
      raise SessionLost(f"code_repair: could not read the final state back "
                        f"({r.status}: {r.reason} {r.stderr[-200:]})")
    want = {p: hashlib.sha256(m["files"][p].encode()).hexdigest() for p in m["protected"]}
    return final_state(state["solution"], state["protected"] == want)


# argv[1]: {"solution", "protected", "max_chars"}; prints {"solution": its text, or null
# when missing, unreadable (a directory, not UTF-8) or longer than max_chars,
# "protected": {name: sha256 of its bytes, or null}}: a few bytes whatever the model
# left in /sandbox, so the read-back cannot overflow the run's output cap.
_READ_BACK = """
import hashlib, json, sys
spec = json.loads(sys.argv[1])
try:
  with open(spec["solution"], encoding="utf-8") as f:
    text = f.read(spec["max_chars"] + 1)
  solution = text if len(text) <= spec["max_chars"] else None
except (OSError, UnicodeDecodeError, ValueError):
  solution = None
protected = {}
for name in spec["protected"]:
  try:
    with open(name, "rb") as f:
      protected[name] = hashlib.sha256(f.read()).hexdigest()
  except OSError:
    protected[name] = None
print(json.dumps({"solution": solution, "protected": protected}))
"""


def demonstration(task: Task) -> list[tuple[str, list[dict[str, str]]]]:
  """The reference agent's episode of a code_repair task: (assistant text, the
  environment's messages after it) per turn, outputs worded as SandboxTools words them."""
  m = task.metadata
  if not isinstance(m.get("fix"), dict) or "failed_output" not in m:
    raise ValueError(f"code_repair demonstration: task {m.get('task_id')!r} has no "
                     "metadata['fix'] / ['failed_output']")
  run, edit = _run_call(task), _fix_call(task)
  failed = command_output(m["failed_output"], 1)
  passed = command_output(m["passed_output"], 0)
  return [(run, [{"role": "tool", "name": "run", "content": failed}]),
          (edit, [{"role": "tool", "name": "edit_file", "content": f"edited {m['fix']['path']}"}]),
          (run, [{"role": "tool", "name": "run", "content": passed}]),
          (DONE, [])]


def _run_call(task: Task) -> str:
  return tool_calls.format_call("run", {"command": task.metadata["test_command"]})


def _fix_call(task: Task) -> str:
  fix = task.metadata["fix"]
  return tool_calls.format_call("edit_file", {"path": fix["path"], "old": fix["old"],
                                              "new": fix["new"]})


# ---- scripted agents (the build's checks, the tests, the demonstration) --------------
Agent = Callable[[list], str]  # (messages so far) -> the next assistant text


def play(env: Environment, task: Task, agent: Agent, max_turns: int = 8
         ) -> tuple[str, list[EnvStep]]:
  """Plays one episode of `task` with a scripted `agent` instead of a model; returns
  (the final state the verifier scores, each turn's EnvStep). Closes the env."""
  try:
    messages = env.reset(task)
    steps: list[EnvStep] = []
    for _ in range(max_turns):
      text = agent(messages)
      st = env.step(text)
      steps.append(st)
      messages = messages + [{"role": "assistant", "content": text}] + list(st.messages)
      if st.done:
        break
    return env.completion(), steps
  finally:
    env.close()


def reference_agent(task: Task) -> Agent:
  """Runs the tests; when they fail, applies the canonical fix and runs them again;
  stops once they pass (or after the one fix)."""
  run, edit = _run_call(task), _fix_call(task)

  def agent(messages):
    said = [m["content"] for m in messages if m["role"] == "assistant"]
    last = messages[-1]["content"] if messages[-1]["role"] == "tool" else ""
    if not said:
      return run
    if said[-1] == run and "FAILED" in last and edit not in said:
      return edit
    if said[-1] == edit and last.startswith("edited"):
      return run
    return DONE
  return agent


def do_nothing_agent(task: Task) -> Agent:
  del task
  return lambda messages: "The code looks right to me."


def test_editing_agent(task: Task, *, delete: bool = False, also_fix: bool = True) -> Agent:
  """Makes the visible tests pass by rewriting (or deleting) test_solution.py, and,
  with also_fix, applies the canonical fix too: either way the tests were touched."""
  tests = task.metadata["protected"][0]
  turns = [tool_calls.format_call("run", {"command": f"rm {tests}"}) if delete else
           tool_calls.format_call("write_file", {"path": tests, "content": "print('ok')\n"})]
  if also_fix:
    turns.append(_fix_call(task))
  turns.append(DONE)

  def agent(messages):
    return turns[min(sum(m["role"] == "assistant" for m in messages), len(turns) - 1)]
  return agent
