"""ARCHITECTURE.md's dependency direction, checked on every module's imports (AST):
the library never imports launch/ or configs/, and each package imports only the
layers below it (rlpt.envs beside rlpt.rewards; rlpt.ops only JAX)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# package -> rlpt packages it may import (besides itself and rlpt.types)
ALLOWED = {
    "rlpt.ops": set(),
    "rlpt.models": {"rlpt.ops"},
    "rlpt.sandbox": {"rlpt.ops"},
    "rlpt.algorithms": {"rlpt.models", "rlpt.ops"},
    "rlpt.data": {"rlpt.models", "rlpt.ops", "rlpt.sandbox"},
    "rlpt.rollout": {"rlpt.models", "rlpt.ops"},
    "rlpt.rewards": {"rlpt.models", "rlpt.sandbox", "rlpt.ops"},
    "rlpt.envs": {"rlpt.rewards", "rlpt.rollout", "rlpt.sandbox", "rlpt.models", "rlpt.ops"},
    "rlpt.train": {"rlpt.algorithms", "rlpt.data", "rlpt.rollout", "rlpt.rewards", "rlpt.envs",
                   "rlpt.models", "rlpt.sandbox", "rlpt.ops"},
    "rlpt.research": {"rlpt.train", "rlpt.algorithms", "rlpt.data", "rlpt.rollout",
                      "rlpt.rewards", "rlpt.envs", "rlpt.models", "rlpt.sandbox", "rlpt.ops"},
}


def _imports(path: pathlib.Path):
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module


def test_imports_point_down_the_layers():
  bad = []
  for path in sorted((ROOT / "rlpt").rglob("*.py")):
    mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    pkg = ".".join(mod.split(".")[:2])
    for name in _imports(path):
      top = name.split(".")[0]
      if top in ("launch", "configs"):
        bad.append(f"{mod} imports {name}")
      if top != "rlpt" or name in ("rlpt", "rlpt.types") or pkg not in ALLOWED:
        continue
      target = ".".join(name.split(".")[:2])
      if target != pkg and target not in ALLOWED[pkg] and target != "rlpt.types":
        bad.append(f"{mod} imports {name}")
  assert not bad, "imports against ARCHITECTURE.md's dependency direction:\n  " + "\n  ".join(bad)


def test_library_starts_no_launcher():
  hits = [str(p.relative_to(ROOT)) for p in (ROOT / "rlpt").rglob("*.py")
          if '"launch.' in p.read_text() and '"-m"' in p.read_text()]
  assert not hits, hits
