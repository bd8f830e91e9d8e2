"""python_tool: answer a task with a Python interpreter at hand.

The episode: a system message says how to call the `python` tool (the format of
rlpt.envs.tool_calls) and how to answer; the user message is the task's prompt.
Each assistant turn with tool calls gets their outputs back (tool turns, run in
the episode's sandbox session); the first turn without a call ends the episode,
and its text is what the task's verifier scores (`completion()`), so the final
`<answer>` is verified exactly as in single-turn training.

`with_tool=False` runs the same task without the tool (the system message offers
none and a call is answered with "no tools are available here"): the "without
the tool" column of an evaluation.

The sandbox session is opened at the first call only, so an episode that answers
at once holds no container.

`demonstration(task)` is the episode the SFT warm-up imitates (rlpt.train.sft):
call `python` with the task's expression, read its output, answer.
"""

from __future__ import annotations

from typing import Any

from rlpt.envs import tool_calls
from rlpt.envs.base import EnvStep, Environment, ToolRecord
from rlpt.envs.sandbox_tools import SandboxTools, ToolLimits, command_output
from rlpt.types import Task

SYSTEM_WITH_TOOL = (
    "You can run Python code. To run it, write a tool call:\n"
    + tool_calls.format_call("python", {"code": "print(17 * 23)"}) + "\n"
    "Its output comes back in <tool_response>...</tool_response>. "
    "When you know the result, give the final answer as <answer>NUMBER</answer>.")
SYSTEM_WITHOUT_TOOL = "Give the final answer as <answer>NUMBER</answer>."
NO_TOOLS = "tool call error: no tools are available here; answer directly"


class PythonToolEnv(Environment):
  """One python_tool episode at a time over sandbox sessions from `pool`."""

  tools = ("python",)

  def __init__(self, pool: Any, limits: ToolLimits = ToolLimits(max_calls=4), *,
               with_tool: bool = True, memory_mb: int = 256):
    self.pool, self.limits, self.with_tool, self.memory_mb = pool, limits, with_tool, memory_mb
    self._session = None
    self._tools: SandboxTools | None = None
    self._last = ""

  def reset(self, task: Task) -> list[dict[str, str]]:
    self.close()
    self._last = ""
    system = SYSTEM_WITH_TOOL if self.with_tool else SYSTEM_WITHOUT_TOOL
    return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

  def step(self, text: str) -> EnvStep:
    self._last = text
    calls = tool_calls.parse(text, self.tools)
    if not calls:
      return EnvStep(done=True)
    records, msgs = [], []
    for call in calls:
      if not self.with_tool:
        out_text, violation, code, name, args, secs = NO_TOOLS, tool_calls.VIOLATION, None, "", {}, 0.0
      else:
        out = self._sandbox_tools().call(call)
        name = call.name if isinstance(call, tool_calls.ToolCall) else ""
        args = call.arguments if isinstance(call, tool_calls.ToolCall) else {}
        out_text, violation, code, secs = out.text, out.violation, out.exit_code, out.seconds
      records.append(ToolRecord(name, args, out_text, code, violation, secs))
      msgs.append({"role": "tool", "name": name or "python", "content": out_text})
    return EnvStep(messages=tuple(msgs), records=tuple(records))

  def completion(self) -> str:
    return self._last

  def tool_seconds(self) -> float:
    return self._tools.seconds if self._tools is not None else 0.0

  def _sandbox_tools(self) -> SandboxTools:
    if self._tools is None:
      self._session = self.pool.session(memory_mb=self.memory_mb,
                                        timeout_s=self.limits.run_timeout_s + 10.0)
      self._tools = SandboxTools(self._session, self.limits, names=self.tools)
    return self._tools

  def close(self) -> None:
    if self._session is not None:
      self._session.close()
    self._session, self._tools = None, None


def demonstration(task: Task) -> list[tuple[str, list[dict[str, str]]]]:
  """The scripted episode of a python_tool task (metadata["expression"], the answer):
  per model turn, its text and the environment's messages after it (none after the
  last), with the tool's output exactly as SandboxTools words it."""
  expr = task.metadata.get("expression")
  if not isinstance(expr, str):
    raise ValueError(f"python_tool demonstration: task has no metadata['expression'] "
                     f"({task.prompt!r})")
  call = tool_calls.format_call("python", {"code": f"print({expr})"})
  out = command_output(f"{task.answer}\n", 0)
  return [(call, [{"role": "tool", "name": "python", "content": out}]),
          (f"<answer>{task.answer}</answer>", [])]
