"""The episode tools in a real runsc session: files persist, commands are limited
per call without losing the episode, bad calls get messages and violations."""

import sys
import pathlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sandbox"))
import sandbox_helpers  # noqa: E402

from rlpt.envs import tool_calls as tc  # noqa: E402
from rlpt.envs.sandbox_tools import SandboxTools, ToolLimits  # noqa: E402

pytestmark = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")

ALL = ("write_file", "read_file", "run", "python")


@pytest.fixture(scope="module")
def pool():
  with sandbox_helpers.isolated_pool(1) as (p, _):
    yield p


def _call(tools, name, **args):
  return tools.call(tc.ToolCall(name, args))


def test_the_edit_run_read_loop_keeps_its_files(pool):
  with pool.session() as s:
    t = SandboxTools(s, ToolLimits(run_timeout_s=3.0), names=ALL)
    assert "write_file" in t.describe() and "python" in t.describe()
    out = _call(t, "write_file", path="pkg/sol.py", content="def f(x):\n  return x + 1\n")
    assert out.violation is None and "wrote pkg/sol.py" in out.text
    out = _call(t, "run", command="python3 -c 'import sys; sys.path.insert(0, \"pkg\"); "
                                  "import sol; assert sol.f(1) == 3, sol.f(1)'")
    assert out.exit_code == 1 and "AssertionError: 2" in out.text and out.violation is None
    _call(t, "write_file", path="/sandbox/pkg/sol.py", content="def f(x):\n  return x + 2\n")
    out = _call(t, "run", command="cd pkg && python3 -c 'import sol; print(sol.f(1))'")
    assert out.exit_code == 0 and out.text.startswith("3\n"), out
    assert _call(t, "read_file", path="pkg/sol.py").text == "def f(x):\n  return x + 2\n"
    out = _call(t, "python", code="print(123456789 * 987654321)")
    assert out.text.startswith(str(123456789 * 987654321)) and out.exit_code == 0
    assert t.calls == 6 and t.seconds > 0


def test_a_hanging_command_or_a_flood_ends_the_call_not_the_episode(pool):
  with pool.session() as s:
    t = SandboxTools(s, ToolLimits(run_timeout_s=1.0, max_output_chars=100), names=ALL)
    _call(t, "write_file", path="keep.txt", content="still here")
    out = _call(t, "run", command="echo before; sleep 30")
    assert out.violation == "tool_timeout" and "before" in out.text and "1 s" in out.text, out
    out = _call(t, "run", command="yes AAAA")
    assert out.violation == "tool_output" and "output cut" in out.text, out
    out = _call(t, "run", command="head -c 5000 /dev/zero | tr '\\0' B")
    assert out.violation is None and "5000 bytes in all, first 100" in out.text, out
    out = _call(t, "run", command="setsid sleep 100 & echo bg")
    assert out.exit_code == 0 and "bg" in out.text
    out = _call(t, "run", command="cat keep.txt; echo; ps -e -o comm= | grep -c sleep",
                timeout_s=60)
    # the files survived every limit, and no process outlived its call
    assert out.text.startswith("still here\n0\n"), out
    assert s.stats.lost == 0


@pytest.mark.parametrize("name,args,needle", [
    ("write_file", {"path": "/etc/passwd", "content": "x"}, "outside /sandbox"),
    ("write_file", {"path": "../../etc/x", "content": "x"}, "outside /sandbox"),
    ("write_file", {"path": "a.txt", "content": 3}, "\"content\" must be a string"),
    ("read_file", {"path": "missing.txt"}, "No such file"),
    ("read_file", {}, "\"path\" must be a non-empty string"),
    ("run", {"command": ["ls"]}, "\"command\" must be a string"),
    ("run", {"command": "ls", "timeout_s": -1}, "\"timeout_s\" must be a positive number"),
])
def test_bad_calls_get_a_message_and_a_violation(pool, name, args, needle):
  with pool.session() as s:
    out = _call(SandboxTools(s, names=ALL), name, **args)
  assert out.violation == "tool_call" and needle in out.text, out


def test_unknown_tools_malformed_calls_and_budgets(pool):
  with pool.session() as s:
    t = SandboxTools(s, ToolLimits(max_calls=2), names=("python",))
    (bad,) = tc.parse("<tool_call>{oops}</tool_call>", ["python"])
    assert t.call(bad).violation == "tool_call"
    out = _call(t, "run", command="ls")
    assert out.violation == "tool_call" and "unknown tool 'run'" in out.text
    assert _call(t, "python", code="print(1)").violation is None
    assert _call(t, "python", code="print(2)").violation is None
    out = _call(t, "python", code="print(3)")
    assert out.violation == "tool_budget" and "at most 2 tool calls" in out.text
  with pytest.raises(ValueError, match="unknown sandbox tools"):
    SandboxTools(None, names=("shell",))
  with pytest.raises(ValueError, match="ToolLimits.max_calls"):
    ToolLimits(max_calls=0)
