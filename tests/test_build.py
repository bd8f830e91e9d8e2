"""Keeps the Bazel BUILD files honest without Bazel (which cannot run offline here).

Every BUILD file is evaluated with stand-ins for the rules it calls (Starlark's
syntax is a subset of Python's); then: every Python module of the tree belongs to
exactly one target, every test module has its own py_test, every source a target
names exists, and every in-repo dependency label names a real target.
"""

import ast
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("rlpt", "launch", "configs", "tests")
SKIP_DIRS = {".venv", "__pycache__", ".git", "runs", "workdirs", "notebooks", "docs", ".ci"}


def _build_files():
  for dirpath, dirnames, filenames in os.walk(ROOT):
    dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
    if "BUILD" in filenames:
      yield pathlib.Path(dirpath) / "BUILD"


def _eval_build(path: pathlib.Path):
  pkg = path.parent.relative_to(ROOT).as_posix()
  pkg = "" if pkg == "." else pkg
  targets = []

  def rule(kind):
    def f(name, srcs=(), deps=(), main=None, **kwargs):
      targets.append(dict(kind=kind, name=name, srcs=list(srcs), deps=list(deps),
                          main=main, pkg=pkg, data=list(kwargs.get("data", ()))))
    return f

  def glob(*a, **k):
    raise AssertionError(f"{path}: glob() hides missing files; list srcs explicitly")

  env = dict(load=lambda *a, **k: None, package=lambda **k: None,
             exports_files=lambda *a, **k: None, glob=glob,
             requirement=lambda name: f"@pypi//{name}",
             py_library=rule("py_library"), py_test=rule("py_test"),
             py_binary=rule("py_binary"), filegroup=rule("filegroup"))
  code = path.read_text()
  ast.parse(code, filename=str(path))
  exec(compile(code, str(path), "exec"), env)  # noqa: S102 -- our own BUILD files
  return targets


def _all_targets():
  out = []
  for b in _build_files():
    out.extend(_eval_build(b))
  return out


def _py_files():
  for top in SOURCE_DIRS:
    for dirpath, dirnames, filenames in os.walk(ROOT / top):
      dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
      for fn in filenames:
        if fn.endswith(".py"):
          yield (pathlib.Path(dirpath) / fn).relative_to(ROOT).as_posix()


def _owning_package(rel: str, packages: set[str]) -> str:
  d = os.path.dirname(rel)
  while d and d not in packages:
    d = os.path.dirname(d)
  return d


def test_every_source_exists():
  for t in _all_targets():
    for s in t["srcs"]:
      p = ROOT / t["pkg"] / s
      assert p.is_file(), f"{t['pkg']}/BUILD target {t['name']!r} names missing source {s!r}"


def test_every_module_has_exactly_one_target():
  targets = _all_targets()
  packages = {t["pkg"] for t in targets} | {
      b.parent.relative_to(ROOT).as_posix() for b in _build_files()}
  owners = {}
  for t in targets:
    for s in t["srcs"]:
      rel = f"{t['pkg']}/{s}" if t["pkg"] else s
      owners.setdefault(rel, []).append(f"//{t['pkg']}:{t['name']}")
  missing, dup = [], []
  for rel in _py_files():
    got = owners.get(rel, [])
    if not got:
      missing.append(f"{rel} (belongs in {_owning_package(rel, packages) or '.'}/BUILD)")
    elif len(got) > 1:
      dup.append(f"{rel}: {got}")
  assert not missing, "modules without a Bazel target:\n  " + "\n  ".join(missing)
  assert not dup, "modules in several targets:\n  " + "\n  ".join(dup)


def test_every_test_module_has_its_own_py_test():
  tests = {}
  for t in _all_targets():
    if t["kind"] == "py_test":
      for s in t["srcs"]:
        tests[f"{t['pkg']}/{s}"] = t
  for rel in _py_files():
    if os.path.basename(rel).startswith("test_"):
      assert rel in tests, f"{rel} has no py_test target"
      t = tests[rel]
      assert t["name"] == os.path.basename(rel)[:-3], f"py_test for {rel} should be named after it"


def _resolve(label: str, pkg: str) -> tuple[str, str]:
  if label.startswith(":"):
    return pkg, label[1:]
  assert label.startswith("//"), label
  body = label[2:]
  p, _, name = body.partition(":")
  return p, name or os.path.basename(p)


def test_every_internal_dep_resolves():
  targets = _all_targets()
  known = {(t["pkg"], t["name"]) for t in targets}
  bad = []
  for t in targets:
    for d in t["deps"] + [x for x in t["data"] if x.startswith(("//", ":"))]:
      if d.startswith("@"):
        continue
      pkg, name = _resolve(d, t["pkg"])
      if (pkg, name) not in known and not (ROOT / pkg / name).is_file():
        bad.append(f"//{t['pkg']}:{t['name']} -> {d}")
  assert not bad, "dependency labels that name no target:\n  " + "\n  ".join(bad)


def test_checker_catches_a_missing_target(tmp_path, monkeypatch):
  """The checks above must be able to fail: a module with no target is reported."""
  (tmp_path / "rlpt").mkdir()
  (tmp_path / "rlpt" / "BUILD").write_text('py_library(name="rlpt", srcs=["a.py"])\n')
  (tmp_path / "rlpt" / "a.py").write_text("")
  (tmp_path / "rlpt" / "b.py").write_text("")
  monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
  with pytest.raises(AssertionError, match="rlpt/b.py"):
    test_every_module_has_exactly_one_target()
