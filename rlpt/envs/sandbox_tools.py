"""The sandbox tools an episode may call: write_file, read_file, edit_file, run, python.

Every tool runs in the episode's SandboxSession (one gVisor container for the
whole episode, /sandbox persisting across calls). A command (`run`, `python`)
runs under a small supervisor inside the sandbox (RUNNER) that enforces the
call's own wall-clock limit and output cap by killing the command's process
group, so a hanging command or an output flood ends that call with a message,
not the container (and with it the episode's files). The container's own
deadline stays behind it as the backstop.

Per episode, `ToolLimits` caps the number of calls and the summed tool time;
past either, a call is refused with a message (violation "tool_budget").

Each call returns a `ToolOutcome`: the text the model reads next, and the
violation it counts, if any ("tool_call": a call that could not be made as
asked: a path outside /sandbox, missing or ill-typed arguments; "tool_timeout",
"tool_output": the command ran past its limit or flooded its output;
"tool_budget"). A failing command (non-zero exit) is no violation: reading
the error is the point of the loop.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import time
from typing import Any, Callable

from rlpt.envs import tool_calls
from rlpt.envs.base import EnvStep, Environment, ToolRecord
from rlpt.sandbox import ExecResult, SandboxSession, SessionLost

NO_TOOLS = "tool call error: no tools are available here; answer directly"

# Runs one command in the sandbox under a wall-clock limit and an output cap;
# argv[1] = {"argv": [...], "timeout_s": t, "max_bytes": n}. Prints the (capped)
# combined output on stdout and its verdict as JSON on stderr.
RUNNER = r'''
import json, os, selectors, signal, subprocess, sys, time
spec = json.loads(sys.argv[1])
cap, flood = spec["max_bytes"], 64 * spec["max_bytes"]
# No bytecode cache: an edit within the same second keeping the file's size would
# otherwise run the stale .pyc (measured: the edit-run loop read the old function).
p = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, start_new_session=True,
                     env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
fd = p.stdout.fileno()
os.set_blocking(fd, False)
sel = selectors.DefaultSelector()
sel.register(fd, selectors.EVENT_READ)
out, total, why = bytearray(), 0, None
deadline = time.monotonic() + spec["timeout_s"]
exited_at = None
while True:
  now = time.monotonic()
  if p.poll() is not None and exited_at is None:
    exited_at = now
  if exited_at is not None and now - exited_at > 0.2:
    break  # something it left behind holds the pipe open
  if now >= deadline:
    why = "timeout"
    break
  if sel.select(min(0.05, deadline - now)):
    try:
      data = os.read(fd, 65536)
    except BlockingIOError:
      continue
    if not data:
      break
    total += len(data)
    if len(out) < cap:
      out += data[:cap - len(out)]
    if total > flood:
      why = "output"
      break
try:
  os.killpg(p.pid, signal.SIGKILL)
except OSError:
  pass
code = p.wait()
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.flush()
sys.stderr.write(json.dumps({"exit": None if why else code, "why": why, "bytes": total}))
'''

# edit_file inside the sandbox: argv[1] = {"path", "old", "new", "max"}; replaces the
# one occurrence of old and says what it did (exit 1: nothing done, and why).
EDITOR = r'''
import json, sys
spec = json.loads(sys.argv[1])
path, old, new = spec["path"], spec["old"], spec["new"]
try:
  text = open(path, encoding="utf-8").read()
except OSError as e:
  print(f"edit_file: {path}: {e.strerror}")
  sys.exit(1)
n = text.count(old)
if n != 1:
  print(f"edit_file: the old text occurs {n} times in {path}; it must occur exactly once")
  sys.exit(1)
text = text.replace(old, new)
if len(text) > spec["max"]:
  print(f"edit_file: {path} would have {len(text)} characters, the limit is {spec['max']}")
  sys.exit(1)
open(path, "w", encoding="utf-8").write(text)
print(f"edited {path}")
'''


@dataclasses.dataclass(frozen=True)
class ToolLimits:
  """Per call and per episode.

  run_timeout_s: a command's default wall-clock limit (a call may ask for less,
    never more).
  max_output_chars: output shown to the model per call (the rest is cut, and
    the model told how much there was).
  max_file_chars: largest file `write_file` writes / `read_file` returns.
  max_calls, max_tool_s: calls and summed tool seconds per episode.
  """

  run_timeout_s: float = 5.0
  max_output_chars: int = 2000
  max_file_chars: int = 100_000
  max_calls: int = 16
  max_tool_s: float = 60.0

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f"ToolLimits.{f.name} must be a positive number, got {v!r}")


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
  """What one call returns to the model, and what it counts."""
  text: str
  violation: str | None = None
  exit_code: int | None = None
  seconds: float = 0.0


SPECS: dict[str, dict[str, Any]] = {
    "write_file": {"description": "Write a text file in /sandbox (replacing it).",
                   "arguments": {"path": "relative path", "content": "the file's text"}},
    "read_file": {"description": "Read a text file in /sandbox.",
                  "arguments": {"path": "relative path"}},
    "edit_file": {"description": "Replace the text `old` (which must occur exactly once) "
                                 "with `new` in a file in /sandbox.",
                  "arguments": {"path": "relative path", "old": "the exact text to replace",
                                "new": "its replacement"}},
    "run": {"description": "Run a shell command in /sandbox; returns its output and exit "
                           "status.",
            "arguments": {"command": "the command line", "timeout_s": "optional, seconds"}},
    "python": {"description": "Run Python code; returns what it prints.",
               "arguments": {"code": "the program"}},
}


class SandboxTools:
  """The tools `names` over one episode's `session`, under `limits`."""

  def __init__(self, session: SandboxSession, limits: ToolLimits = ToolLimits(), *,
               names: tuple[str, ...] = ("write_file", "read_file", "run")):
    unknown = sorted(set(names) - set(SPECS))
    if unknown:
      raise ValueError(f"unknown sandbox tools {unknown}; known: {sorted(SPECS)}")
    self.session, self.limits, self.names = session, limits, tuple(names)
    self.calls, self.seconds = 0, 0.0
    self._impl: dict[str, Callable[[dict], ToolOutcome]] = {
        "write_file": self._write_file, "read_file": self._read_file,
        "edit_file": self._edit_file, "run": self._run, "python": self._python}

  def describe(self) -> str:
    """The tool list for a system prompt."""
    return describe(self.names)

  def call(self, call: tool_calls.ToolCall | tool_calls.ToolCallError) -> ToolOutcome:
    """Makes one call (or answers one that could not be read)."""
    if isinstance(call, tool_calls.ToolCallError):
      return ToolOutcome(call.message, tool_calls.VIOLATION)
    if call.name not in self.names:
      return ToolOutcome(f"tool call error: unknown tool {call.name!r}; the tools are "
                         f"{', '.join(self.names)}", tool_calls.VIOLATION)
    if self.calls >= self.limits.max_calls:
      return ToolOutcome(f"tool budget spent: at most {self.limits.max_calls} tool calls per "
                         "episode", "tool_budget")
    if self.seconds >= self.limits.max_tool_s:
      return ToolOutcome(f"tool budget spent: at most {self.limits.max_tool_s:g} s of tool "
                         "time per episode", "tool_budget")
    self.calls += 1
    t0 = time.perf_counter()
    out = self._impl[call.name](call.arguments)
    dt = time.perf_counter() - t0
    self.seconds += dt
    return dataclasses.replace(out, seconds=dt)

  # ---- the tools ---------------------------------------------------------------
  def _path(self, args: dict) -> str | ToolOutcome:
    p = args.get("path")
    if not isinstance(p, str) or not p.strip():
      return ToolOutcome("tool call error: \"path\" must be a non-empty string",
                         tool_calls.VIOLATION)
    p = p.strip()
    norm = posixpath.normpath(posixpath.join("/sandbox", p))
    if norm == "/sandbox" or not norm.startswith("/sandbox/"):
      return ToolOutcome(f"tool call error: path {p!r} is outside /sandbox; files live in "
                         "/sandbox (use a relative path)", tool_calls.VIOLATION)
    return norm[len("/sandbox/"):]

  def _str_arg(self, args: dict, key: str) -> str | ToolOutcome:
    v = args.get(key)
    if not isinstance(v, str):
      return ToolOutcome(f"tool call error: \"{key}\" must be a string, got "
                         f"{type(v).__name__}", tool_calls.VIOLATION)
    return v

  def _write_file(self, args: dict) -> ToolOutcome:
    path = self._path(args)
    content = self._str_arg(args, "content")
    for v in (path, content):
      if isinstance(v, ToolOutcome):
        return v
    if len(content) > self.limits.max_file_chars:
      return ToolOutcome(f"tool call error: content has {len(content)} characters, the limit "
                         f"is {self.limits.max_file_chars}", tool_calls.VIOLATION)
    r = self.session.run({path: content}, ["python3", "-c", ""], timeout_s=10.0)
    if not r.ok:
      return ToolOutcome(f"write_file failed: {_why(r)}", tool_calls.VIOLATION)
    return ToolOutcome(f"wrote {path} ({len(content)} characters)")

  def _read_file(self, args: dict) -> ToolOutcome:
    path = self._path(args)
    if isinstance(path, ToolOutcome):
      return path
    n = self.limits.max_file_chars
    prog = ("import sys\ntry:\n  t = open(sys.argv[1], encoding='utf-8', errors='replace')"
            f".read({n} + 1)\nexcept OSError as e:\n  sys.exit(f'read_file: {{e.strerror}}')\n"
            "sys.stdout.write(t)\n")
    r = self.session.run({}, ["python3", "-c", prog, path], timeout_s=10.0)
    if r.status == "error":
      return ToolOutcome(r.stderr.strip() or "read_file failed", tool_calls.VIOLATION)
    if not r.ok:
      return ToolOutcome(f"read_file failed: {_why(r)}", tool_calls.VIOLATION)
    return ToolOutcome(self._clip(r.stdout, n))

  def _edit_file(self, args: dict) -> ToolOutcome:
    """An exact replacement of one occurrence: an `old` text that is missing or occurs
    more than once is the model's error to read (exit status 1), no violation."""
    path = self._path(args)
    old, new = self._str_arg(args, "old"), self._str_arg(args, "new")
    for v in (path, old, new):
      if isinstance(v, ToolOutcome):
        return v
    if not old:
      return ToolOutcome("tool call error: \"old\" must not be empty", tool_calls.VIOLATION)
    if len(new) > self.limits.max_file_chars:
      return ToolOutcome(f"tool call error: new has {len(new)} characters, the limit is "
                         f"{self.limits.max_file_chars}", tool_calls.VIOLATION)
    spec = json.dumps({"path": path, "old": old, "new": new, "max": self.limits.max_file_chars})
    r = self.session.run({}, ["python3", "-c", EDITOR, spec], timeout_s=10.0)
    if r.status == "error":
      return ToolOutcome(r.stdout.strip() or r.stderr.strip()[-300:] or "edit_file failed",
                         exit_code=r.exit_code)
    if not r.ok:
      return ToolOutcome(f"edit_file failed: {_why(r)}", tool_calls.VIOLATION)
    return ToolOutcome(r.stdout.strip(), exit_code=0)

  def _run(self, args: dict) -> ToolOutcome:
    cmd = self._str_arg(args, "command")
    if isinstance(cmd, ToolOutcome):
      return cmd
    t = args.get("timeout_s", self.limits.run_timeout_s)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
      return ToolOutcome("tool call error: \"timeout_s\" must be a positive number",
                         tool_calls.VIOLATION)
    return self._command(["sh", "-c", cmd], min(float(t), self.limits.run_timeout_s))

  def _python(self, args: dict) -> ToolOutcome:
    code = self._str_arg(args, "code")
    if isinstance(code, ToolOutcome):
      return code
    return self._command(["python3", "-c", code], self.limits.run_timeout_s)

  def _command(self, argv: list[str], timeout_s: float) -> ToolOutcome:
    cap = self.limits.max_output_chars * 4  # bytes; the model sees max_output_chars
    spec = json.dumps({"argv": argv, "timeout_s": timeout_s, "max_bytes": cap})
    r = self.session.run({}, ["python3", "-c", RUNNER, spec], timeout_s=timeout_s + 10.0)
    try:
      verdict = json.loads(r.stderr.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
      verdict = None
    if not r.ok or not isinstance(verdict, dict):  # the runner itself did not finish
      return ToolOutcome(f"the command could not finish: {_why(r)}",
                         {"timeout": "tool_timeout", "output_limit": "tool_output"}.get(r.status))
    out = self._clip(r.stdout, self.limits.max_output_chars, total_bytes=verdict.get("bytes"))
    if verdict.get("why") == "timeout":
      return ToolOutcome(f"{out}\n[killed: still running after {timeout_s:g} s]".lstrip(),
                         "tool_timeout")
    if verdict.get("why") == "output":
      return ToolOutcome(f"{out}\n[killed: output flood]".lstrip(), "tool_output")
    code = verdict.get("exit")
    return ToolOutcome(command_output(out, code), exit_code=code)

  @staticmethod
  def _clip(text: str, n: int, total_bytes: int | None = None) -> str:
    if len(text) <= n and (total_bytes is None or total_bytes <= len(text.encode())):
      return text
    size = f"{total_bytes} bytes" if total_bytes is not None else f"{len(text)} characters"
    return f"{text[:n]}\n[output cut: {size} in all, first {n} characters shown]"


class SandboxToolEnv(Environment):
  """An environment whose tools (`tools`, SandboxTools by name) run in one sandbox
  session per episode, opened at the first call (an episode that answers at once
  holds no container) with the files of `workspace()` written into /sandbox.

  `answer(calls)` makes a turn's calls and words their outputs as tool messages;
  with `with_tool=False` every call is refused with NO_TOOLS (a violation): the
  "without the tool" column of an evaluation. Subclasses define `reset`, `step`
  (parse the turn, end the episode or `answer`) and `completion`.
  """

  def __init__(self, pool: Any, limits: ToolLimits, *, with_tool: bool = True,
               memory_mb: int = 256):
    self.pool, self.limits, self.with_tool, self.memory_mb = pool, limits, with_tool, memory_mb
    self._session: SandboxSession | None = None
    self._tools: SandboxTools | None = None

  def workspace(self) -> dict[str, str]:
    """Files the session starts with (default: none)."""
    return {}

  def answer(self, calls: list) -> EnvStep:
    records, msgs = [], []
    for call in calls:
      name = call.name if isinstance(call, tool_calls.ToolCall) else ""
      args = call.arguments if isinstance(call, tool_calls.ToolCall) else {}
      if not self.with_tool:
        out = ToolOutcome(NO_TOOLS, tool_calls.VIOLATION)
      else:
        out = self.sandbox_tools().call(call)
      records.append(ToolRecord(name, args, out.text, out.exit_code, out.violation, out.seconds))
      msgs.append({"role": "tool", "name": name or self.tools[0], "content": out.text})
    return EnvStep(messages=tuple(msgs), records=tuple(records))

  def sandbox_tools(self) -> SandboxTools:
    """The episode's tools, opening its session (and writing `workspace()`) first."""
    if self._tools is None:
      self._session = self.pool.session(memory_mb=self.memory_mb,
                                        timeout_s=self.limits.run_timeout_s + 10.0)
      files = self.workspace()
      if files:
        r = self._session.run(files, ["python3", "-c", ""], timeout_s=10.0)
        if r.status != "ok":
          raise SessionLost(f"could not write the episode's files ({r.status}: {r.reason})")
      self._tools = SandboxTools(self._session, self.limits, names=self.tools)
    return self._tools

  def tool_seconds(self) -> float:
    return self._tools.seconds if self._tools is not None else 0.0

  def close(self) -> None:
    if self._session is not None:
      self._session.close()
    self._session, self._tools = None, None


def describe(names) -> str:
  """The tools `names`, one line each, for a system prompt."""
  lines = []
  for n in names:
    s = SPECS[n]
    args = ", ".join(f'"{k}": {v}' for k, v in s["arguments"].items())
    lines.append(f"- {n}: {s['description']} Arguments: {{{args}}}")
  return "\n".join(lines)


def command_output(output: str, exit_code: int | None) -> str:
  """What the model reads after a command that ran to its end: its (clipped)
  output, then its exit status."""
  return f"{output}\n[exit status {exit_code}]".lstrip()


def _why(r: ExecResult) -> str:
  if r.status == "error":
    return f"exit status {r.exit_code}: {r.stderr.strip()[-300:]}"
  return f"{r.status}: {r.reason}"
