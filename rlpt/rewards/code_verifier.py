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
Score ("all", the default and HumanEval's own metric): 1 only when every assert
passed and the tests ran to the end, else 0. With "fraction", partial credit counts
only the asserts that carry information: an assert line that a null implementation
of the entry point passes (one returning None, True, False, 0, "" or [], whatever its
arguments) is free, and is neither credited nor counted. A stub earns nothing either
way; where every assert holds for one constant or another (a predicate's asserts hold
for True or for False), only a complete pass counts. The null implementations'
verdicts are computed once per problem (cached by the
test source) in the same sandbox; a null run the sandbox itself could not do raises
(an infrastructure failure is never a score).

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
import threading

from rlpt.rewards.registry import Verifier, VerifierUnavailable
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
    self.lines: list[int] = []

  def visit_Assert(self, node: ast.Assert):
    line = node.lineno
    self.lines.append(line)
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
  src, lines = _instrument(source)
  return src, len(lines)


def _instrument(source: str) -> tuple[str, tuple[int, ...]]:
  """(rewritten source, the line of every assert statement in it), cached. One thread
  at a time: CPython 3.11's AST constructors keep a recursion-depth counter that
  concurrent threads corrupt ("SystemError: AST constructor recursion depth mismatch",
  seen once in 328 concurrent verifications)."""
  with _AST_LOCK:
    return _instrument_locked(source)


_AST_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1024)
def _instrument_locked(source: str) -> tuple[str, tuple[int, ...]]:
  try:
    tree = ast.parse(source)
  except SyntaxError as e:
    raise ValueError(f"code task: the test source does not parse: {e}") from None
  if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
    raise ValueError("code task: the test source must define check(candidate)")
  inst = _Instrument()
  tree = ast.fix_missing_locations(inst.visit(tree))
  return ast.unparse(tree), tuple(inst.lines)


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


_STATUS_VIOLATION = {"timeout": "timeout", "oom": "resource", "output_limit": "resource"}


# What a null implementation of the entry point returns, whatever its arguments.
NULL_RETURNS = ("None", "True", "False", "0", "''", "[]")


class SandboxUnavailable(VerifierUnavailable):
  """The sandbox could not run a program (infra_error): no verdict exists to score."""


def sandbox_capacity(who: str = "code verifier") -> tuple[tuple[str, int], int]:
  """registry.Verifier.capacity of the sandboxed verifiers: the default sandbox pool's
  warm containers (SandboxPool.capacity), keyed by that pool."""
  from rlpt import sandbox
  try:
    pool = sandbox.default_pool()
  except sandbox.RunscNotFound as e:
    raise SandboxUnavailable(f"{who}: the sandbox could not run: {e}") from e
  return ("sandbox", id(pool)), pool.capacity


@dataclasses.dataclass
class CodeVerifier(Verifier):
  """Runs `task.answer` (tests defining check(candidate)) against the completion's code.

  Attributes:
    scoring: "all" (all-or-nothing, the default) or "fraction" (partial credit for the
      asserts no null implementation passes; see the module docstring).
    cpu_s: CPU seconds the tests may use (the candidate's process and the harness
      together) before they are stopped as a timeout. Counting CPU rather than wall
      time keeps a verdict from depending on how loaded the machine is.
    timeout_s: sandbox wall-clock limit (seconds); the tests get 2 s less (this is
      what stops a candidate that sleeps or blocks).
    memory_mb, max_pids: sandbox limits.
  """

  scoring: str = "all"
  cpu_s: float = 8.0
  timeout_s: float | None = 20.0
  memory_mb: int = 512
  max_pids: int = 64
  isolation: str = "inline"

  def capacity(self):
    return sandbox_capacity()

  def __post_init__(self):
    if self.scoring not in ("fraction", "all"):
      raise ValueError(f"CodeVerifier.scoring must be 'fraction' or 'all', got {self.scoring!r}")

  def _run(self, task: Task, code: str):
    """(sandbox result, the harness's verdict dict or None) of `code` against the tests."""
    from rlpt import sandbox
    tests, _ = _instrument(task.answer)
    prelude = task.metadata.get("test_prelude", "")
    nonce = secrets.token_hex(16)
    job = {"tests": tests, "prelude": prelude, "entry_point": task.metadata["entry_point"],
           "nonce": nonce, "budget_s": float(self.cpu_s),
           "wall_s": max(1.0, float(self.timeout_s) - 2.0)}
    files = {**_harness_files(), "job.json": json.dumps(job),
             "candidate.py": (prelude + "\n\n" if prelude else "") + code}
    try:
      res = sandbox.run(files, ["python3", "-I", "harness.py"], timeout_s=float(self.timeout_s),
                        memory_mb=self.memory_mb, max_pids=self.max_pids)
    except sandbox.RunscNotFound as e:
      raise SandboxUnavailable(f"code verifier: the sandbox could not run: {e}") from e
    return res, parse_verdict(res.stdout, nonce)

  def prepare(self, task: Task) -> None:
    """With "fraction" scoring, the null runs of `task` (before any budget starts)."""
    if self.scoring == "fraction" and isinstance(task.answer, str) and task.metadata.get(
        "entry_point"):
      self.free_lines(task)

  def free_lines(self, task: Task) -> frozenset[int]:
    """Assert lines of `task`'s tests that some null implementation passes (cached)."""
    key = (task.answer, task.metadata["entry_point"], task.metadata.get("test_prelude", ""))
    if key not in _FREE_LINES:
      entry = task.metadata["entry_point"]
      free: set[int] = set()
      for value in NULL_RETURNS:
        res, out = self._run(task, f"def {entry}(*args, **kwargs):\n    return {value}\n")
        if out is None:
          if res.status == "infra_error":
            raise SandboxUnavailable(f"code verifier: the null run of {entry} could not run: "
                                     f"{res.stderr[-300:]}")
          continue
        by_line: dict[int, list[bool]] = {}
        for line, ok in out["records"]:
          by_line.setdefault(int(line), []).append(ok)
        free |= {line for line, oks in by_line.items() if all(oks)}
      _FREE_LINES[key] = frozenset(free)
    return _FREE_LINES[key]

  def verify(self, task: Task, completion: str) -> RewardResult:
    entry = task.metadata.get("entry_point")
    if not isinstance(task.answer, str) or not entry:
      raise ValueError("code task needs answer=<test source> and metadata['entry_point']")
    code = extract_code(completion)
    if code is None:
      return RewardResult(0.0, ("format",), details={"reason": "no ```python block"})
    return self.verify_code(task, code)

  def verify_code(self, task: Task, code: str) -> RewardResult:
    """`verify` of the program `code` itself (no fenced block to find): the
    code_repair verifier scores an episode's final solution.py with it."""
    _, lines = _instrument(task.answer)
    res, out = self._run(task, code)
    details = {"status": res.status, "wall_s": res.wall_s}
    if out is None:
      if res.status == "infra_error":
        raise SandboxUnavailable(f"code verifier: the sandbox could not run the candidate: "
                                 f"{res.stderr[-300:]}")
      v = _STATUS_VIOLATION.get(res.status, "sandbox")
      return RewardResult(0.0, (v,), details={**details, "reason": "no valid harness record",
                                              "stderr": res.stderr[-500:]})
    recs = out["records"]
    passed = sum(1 for _, ok in recs if ok)
    total = max(len(recs), len(lines))
    complete = total > 0 and passed == total and not out.get("aborted") and not out.get(
        "load_error")
    details.update(passed=passed, total=total, aborted=out.get("aborted"),
                   load_error=out.get("load_error"))
    violations = ("timeout",) if out.get("aborted") == "timeout" else ()
    if self.scoring == "all":
      return RewardResult(float(complete), violations, details=details)
    free = self.free_lines(task)
    counted = [ok for line, ok in recs if int(line) not in free]
    informative = max(len(counted), sum(1 for ln in lines if ln not in free))
    details.update(free_asserts=sum(1 for ln in lines if ln in free), informative=informative)
    if informative == 0:  # every assert is passed by a constant: only a complete pass counts
      return RewardResult(float(complete), violations, details=details)
    return RewardResult(sum(counted) / informative, violations, details=details)


_FREE_LINES: dict[tuple[str, str, str], frozenset[int]] = {}
