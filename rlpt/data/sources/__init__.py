"""Task sources, one per domain: seeded, index-addressed, disjoint train / holdout.

Every source has `train(index) -> Task` (a pure function of its seed and the
index), `holdout(n) -> list[Task]` (never overlapping train, see `splits`) and
`reference(task) -> str | None` (a completion its domain's verifier scores 1;
None where the generator has no reference solution).

  from rlpt.data import sources
  src = sources.get_source("rg/chain_sum", seed=0)
  task = src.train(0)

A new domain registers its source factory (and its verifier with
`rlpt.rewards.register`), then trains like a built-in one:

  sources.register("max_digit", lambda seed=0: MaxDigitSource(seed))
"""

from __future__ import annotations

from typing import Any, Callable

from rlpt.data.sources.splits import SPLITS, is_holdout, split_of


def _rg(name: str) -> Callable[..., Any]:
  def make(seed: int = 0):
    from rlpt.data.sources import rg_tasks
    return rg_tasks.RGSource(name, seed)
  return make


def _math(seed: int = 0):
  from rlpt.data.sources import math_tasks
  return math_tasks.MathSource(seed=seed)


def _extraction(seed: int = 0):
  from rlpt.data.sources import extraction_tasks
  return extraction_tasks.ExtractionSource(seed=seed)


def _code(seed: int = 0):
  from rlpt.data.sources import code_tasks
  return code_tasks.CodeSource(seed=seed)


def _geometry(seed: int = 0):
  from rlpt.data.sources import geometry_tasks
  return geometry_tasks.GeometrySource(seed=seed)


def _python_tool(seed: int = 0):
  from rlpt.data.sources import tool_tasks
  return tool_tasks.PythonToolSource(seed=seed)


def _code_repair(seed: int = 0):
  from rlpt.data.sources import repair_tasks
  return repair_tasks.CodeRepairSource(seed=seed)


_REGISTERED: dict[str, Callable[..., Any]] = {}


def register(domain: str, factory: Callable[..., Any], *, replace: bool = True) -> None:
  """Makes `factory(seed=0) -> TaskSource` the source of `domain` (a new domain, or one
  replacing a built-in source); KeyError when `domain` has one and not `replace`."""
  if not isinstance(domain, str) or not domain:
    raise ValueError(f"sources.register: domain must be a non-empty string, got {domain!r}")
  if not callable(factory):
    raise TypeError(f"sources.register({domain!r}): factory must be callable (seed) -> "
                    f"TaskSource, got {type(factory).__name__}")
  if not replace and domain in _factories():
    raise KeyError(f"sources.register: domain {domain!r} already has a task source")
  _REGISTERED[domain] = factory


def _factories() -> dict[str, Callable[..., Any]]:
  from rlpt.data.sources import rg_tasks
  out: dict[str, Callable[..., Any]] = {"math": _math, "extraction": _extraction, "code": _code,
                                        "geometry": _geometry, "python_tool": _python_tool,
                                        "code_repair": _code_repair}
  for name in rg_tasks.generators():
    out[f"rg/{name}"] = _rg(name)
  out.update(_REGISTERED)
  return out


def domains() -> list[str]:
  """Every domain with a built-in task source."""
  return sorted(_factories())


def get_source(domain: str, seed: int = 0):
  """The built-in task source of `domain`, seeded with `seed`."""
  factories = _factories()
  if domain not in factories:
    import difflib
    close = difflib.get_close_matches(domain, list(factories), n=3)
    raise KeyError(f"no task source for domain {domain!r}"
                   + (f"; did you mean {close}?" if close else ""))
  return factories[domain](seed)


__all__ = ["SPLITS", "domains", "get_source", "is_holdout", "register", "split_of"]
