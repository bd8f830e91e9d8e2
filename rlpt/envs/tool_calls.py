"""Tool calls in model text, and tool results as chat messages.

The one format (the Hermes / Qwen convention): each call is a JSON object with a
"name" and an "arguments" object between tags, anywhere in an assistant turn:

  <tool_call>
  {"name": "python", "arguments": {"code": "print(123 * 456)"}}
  </tool_call>

`arguments` may also be a JSON string that holds an object (some models emit
that). Text outside the tags is the model's own prose. A call that cannot be
read (no closing tag, not JSON, no name, arguments not an object, an unknown
tool) becomes a `ToolCallError`: the environment answers it with the error text
and records the violation "tool_call", and the episode goes on.

Tool results go back through the model's chat template. Where the template has a
tool role (its source handles a "tool" message, as Qwen's and Llama 3's do), a
result is {"role": "tool", "name": ..., "content": ...}. Where it does not (SmolLM2's
template renders every role verbatim, and the model never saw a "tool" turn), the
result is a user turn whose content is wrapped as `<tool_response>...</tool_response>`,
the form Qwen's own template gives a tool message, so the text the model reads has
the same shape either way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Iterable, Mapping

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.S)
VIOLATION = "tool_call"


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One well-formed call: `name` is a known tool, `arguments` its JSON object."""
  name: str
  arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ToolCallError:
  """A call that could not be read; `message` is what the model is told."""
  message: str
  raw: str


def parse(text: str, tools: Iterable[str]) -> list[ToolCall | ToolCallError]:
  """The calls in an assistant turn `text`, in order; `tools`: the known names."""
  known = sorted(set(tools))
  out: list[ToolCall | ToolCallError] = []
  for m in _BLOCK.finditer(text):
    raw = m.group(0)
    if not raw.endswith(CLOSE):
      out.append(ToolCallError(f"tool call error: {OPEN} without {CLOSE}", raw))
      continue
    out.append(_one(m.group(1).strip(), raw, known))
  return out


def _one(body: str, raw: str, known: list[str]) -> ToolCall | ToolCallError:
  try:
    obj = json.loads(body)
  except json.JSONDecodeError as e:
    return ToolCallError(f"tool call error: the call is not valid JSON ({e.msg} at char "
                         f"{e.pos}); expected {{\"name\": ..., \"arguments\": {{...}}}}", raw)
  if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
    return ToolCallError("tool call error: expected a JSON object with a string \"name\" and "
                         "an \"arguments\" object", raw)
  name, args = obj["name"], obj.get("arguments", {})
  if isinstance(args, str):
    try:
      args = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError:
      pass
  if not isinstance(args, dict):
    return ToolCallError(f"tool call error: \"arguments\" of {name!r} must be a JSON object, "
                         f"got {type(args).__name__}", raw)
  if name not in known:
    return ToolCallError(f"tool call error: unknown tool {name!r}; the tools are "
                         f"{', '.join(known)}", raw)
  return ToolCall(name, args)


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
  """The text of one call in the documented format (demonstrations, tests)."""
  return f"{OPEN}\n{json.dumps({'name': name, 'arguments': dict(arguments)})}\n{CLOSE}"


def template_has_tool_role(chat_template: str | None) -> bool:
  """Whether a chat template handles "tool" messages itself (its source names the
  role); otherwise results enter as `<tool_response>` user turns."""
  return bool(chat_template) and re.search(r"""["']tool["']""", chat_template) is not None


def result_message(name: str, content: str, *, tool_role: bool) -> dict[str, str]:
  """A tool result as one chat message (see the module docstring)."""
  if tool_role:
    return {"role": "tool", "name": name, "content": content}
  return {"role": "user", "content": f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"}
