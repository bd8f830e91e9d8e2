"""The "code" verifier: hidden HumanEval-style tests, run in the gVisor sandbox,
with a verdict the candidate cannot forge.

Threat model: the candidate's code may do anything its process can (exit early,
raise SystemExit / KeyboardInterrupt, return objects whose __eq__ is always
True, monkeypatch builtins, drop a conftest.py, print fake results, read or
rewrite files, fork, sleep). So:
  * The tests never run in the candidate's process. The sandbox's main process
    (harness_parent.py) reads the tests and a per-run random nonce from
    job.json, deletes it before any candidate code exists, makes itself
    non-dumpable, and starts the candidate in a separate `python3 -I` process.
  * check(candidate) runs in the harness with a proxy: each call ships plain-data
    arguments to the candidate process and gets plain data back (the codec
    refuses any other type), so a rigged __eq__ or patched builtin never reaches
    the asserts, and an exit / crash / hang of the candidate is a failed call.
  * Every assert of the test source is rewritten (here, outside the sandbox) to
    append a (line, passed) record in the harness; after the tests the harness
    SIGKILLs every other process of its uid, then prints one line
    "<nonce> <json>". The candidate cannot see the nonce, cannot write to the
    harness's stdout, and nothing runs after the line, so the verdict comes only
    from that line, parsed here; no line, two lines or a bad one -> 0 with a
    "sandbox" violation.
Score: passed / max(executed asserts, asserts in the source) ("fraction"), or 1
only when every assert passed and the tests ran to the end ("all").

Known limit: the tests run in the harness, so a candidate cannot read them from
disk or memory; it can still observe the arguments it is called with.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import re
import secrets

from rlpt.rewards.registry import Verifier
from rlpt.types import RewardResult, Task

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_HERE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _harness_files() -> dict[str, str]:
  def read(name):
    with open(os.path.join(_HERE, name)) as f:
      return f.read()
  codec = read("harness_codec.py")
  return {"harness.py": codec + "\n" + read("harness_parent.py"),
          "runner.py": codec + "\n" + read("harness_runner.py")}


def extract_code(completion: str) -> str | None:
  """The last fenced ```python (or bare ```) block of the completion, else None."""
  blocks = _FENCE.findall(completion)
  return blocks[-1] if blocks else None


class _Instrument(ast.NodeTransformer):
  """assert E, msg  ->  try: ok = bool(E) / except Exception: ok = False / record(line, ok)."""

  def __init__(self):
    self.count = 0

  def visit_Assert(self, node: ast.Assert):
    self.count += 1
    line = node.lineno
    stmts = ast.parse(
        "try:\n  __rlpt_ok = bool(__rlpt_expr__)\nexcept Exception:\n  __rlpt_ok = False\n"
        f"__rlpt_record({line}, __rlpt_ok)\n").body
    stmts[0].body[0].value.args[0] = node.test
    for s in stmts:
      ast.copy_location(s, node)
      ast.fix_missing_locations(s)
    return stmts


def instrument_tests(source: str) -> tuple[str, int]:
  """(rewritten source, number of asserts in it); see module doc."""
  try:
    tree = ast.parse(source)
  except SyntaxError as e:
    raise ValueError(f"code task: the test source does not parse: {e}") from None
  if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
    raise ValueError("code task: the test source must define check(candidate)")
  inst = _Instrument()
  tree = ast.fix_missing_locations(inst.visit(tree))
  return ast.unparse(tree), inst.count


def parse_verdict(stdout: str, nonce: str) -> dict | None:
  """The harness's record dict from the single '<nonce> <json>' line, else None."""
  lines = [ln for ln in stdout.splitlines() if ln.startswith(nonce + " ")]
  if len(lines) != 1 or stdout.rstrip("\n").splitlines()[-1] != lines[0]:
    return None
  try:
    out = json.loads(lines[0][len(nonce) + 1:])
  except ValueError:
    return None
  recs = out.get("records") if isinstance(out, dict) else None
  if not isinstance(recs, list) or not all(
      isinstance(r, list) and len(r) == 2 and isinstance(r[1], bool) for r in recs):
    return None
  return out


_STATUS_VIOLATION = {"timeout": "timeout", "oom": "resource", "output_limit": "resource",
                     "infra_error": "infra_error"}


@dataclasses.dataclass
class CodeVerifier(Verifier):
  """Runs `task.answer` (tests defining check(candidate)) against the completion's code.

  Attributes:
    scoring: "fraction" (passed asserts / asserts) or "all" (all-or-nothing).
    timeout_s: sandbox wall-clock limit (seconds); the tests get 2 s less.
    memory_mb, max_pids: sandbox limits.
  """

  scoring: str = "fraction"
  timeout_s: float | None = 10.0
  memory_mb: int = 512
  max_pids: int = 64
  isolation: str = "inline"

  def __post_init__(self):
    if self.scoring not in ("fraction", "all"):
      raise ValueError(f"CodeVerifier.scoring must be 'fraction' or 'all', got {self.scoring!r}")

  def verify(self, task: Task, completion: str) -> RewardResult:
    from rlpt import sandbox
    entry = task.metadata.get("entry_point")
    if not isinstance(task.answer, str) or not entry:
      raise ValueError("code task needs answer=<test source> and metadata['entry_point']")
    tests, n_static = instrument_tests(task.answer)
    code = extract_code(completion)
    if code is None:
      return RewardResult(0.0, ("format",), details={"reason": "no ```python block"})
    prelude = task.metadata.get("test_prelude", "")
    nonce = secrets.token_hex(16)
    job = {"tests": tests, "prelude": prelude, "entry_point": entry, "nonce": nonce,
           "budget_s": max(1.0, float(self.timeout_s) - 2.0)}
    files = {**_harness_files(), "job.json": json.dumps(job),
             "candidate.py": (prelude + "\n\n" if prelude else "") + code}
    res = sandbox.run(files, ["python3", "-I", "harness.py"], timeout_s=float(self.timeout_s),
                      memory_mb=self.memory_mb, max_pids=self.max_pids)
    details = {"status": res.status, "wall_s": res.wall_s}
    out = parse_verdict(res.stdout, nonce)
    if out is None:
      v = _STATUS_VIOLATION.get(res.status, "sandbox")
      return RewardResult(0.0, (v,), details={**details, "reason": "no valid harness record",
                                              "stderr": res.stderr[-500:]})
    recs = out["records"]
    passed = sum(1 for _, ok in recs if ok)
    total = max(len(recs), n_static)
    details.update(passed=passed, total=total, aborted=out.get("aborted"),
                   load_error=out.get("load_error"))
    violations = ("timeout",) if out.get("aborted") == "timeout" else ()
    if self.scoring == "all":
      score = float(total > 0 and passed == total and not out.get("aborted")
                    and not out.get("load_error"))
    else:
      score = passed / total if total else 0.0
    return RewardResult(score, violations, details=details)
