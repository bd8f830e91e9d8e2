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
from rlpt.envs.base import EnvStep
from rlpt.envs.sandbox_tools import NO_TOOLS, SandboxToolEnv, ToolLimits, command_output
from rlpt.types import Task

SYSTEM_WITH_TOOL = (
    "You can run Python code. To run it, write a tool call:\n"
    + tool_calls.format_call("python", {"code": "print(17 * 23)"}) + "\n"
    "Its output comes back in <tool_response>...</tool_response>. "
    "When you know the result, give the final answer as <answer>NUMBER</answer>.")
SYSTEM_WITHOUT_TOOL = "Give the final answer as <answer>NUMBER</answer>."
__all__ = ["NO_TOOLS", "PythonToolEnv", "demonstration"]


class PythonToolEnv(SandboxToolEnv):
  """One python_tool episode at a time over sandbox sessions from `pool`."""

  tools = ("python",)

  def __init__(self, pool: Any, limits: ToolLimits = ToolLimits(max_calls=4), *,
               with_tool: bool = True, memory_mb: int = 256):
    super().__init__(pool, limits, with_tool=with_tool, memory_mb=memory_mb)
    self._last = ""

  def reset(self, task: Task) -> list[dict[str, str]]:
    self.close()
    self._last = ""
    system = SYSTEM_WITH_TOOL if self.with_tool else SYSTEM_WITHOUT_TOOL
    return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

  def step(self, text: str) -> EnvStep:
    self._last = text
    calls = tool_calls.parse(text, self.tools)
    return self.answer(calls) if calls else EnvStep(done=True)

  def completion(self) -> str:
    return self._last


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
