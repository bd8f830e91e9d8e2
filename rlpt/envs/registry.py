"""Which domains are played as multi-turn episodes, and by which environment.

A domain listed here is an episodic domain: the RL step, the holdout evaluation
and the SFT warm-up play its tasks as episodes of its environment (rlpt.envs.
episode), scored by the domain's verifier like any other (rlpt.rewards). Every
other domain stays single-turn.

  spec = registry.get("python_tool")        # EnvSpec, or None for a single-turn domain
  env = spec.make(pool, ToolLimits(max_calls=4), with_tools=True)
  turns = spec.demonstration(task)          # [(assistant text, env messages)], for SFT

A new environment registers itself with `register(domain, EnvSpec(...))`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rlpt.envs.base import Environment
from rlpt.types import Task

Demonstration = list[tuple[str, list[dict[str, str]]]]


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """make(pool, limits, with_tools) -> a fresh Environment (one episode at a time);
  demonstration(task) -> the scripted episode SFT imitates (None: the domain has none,
  and its SFT demonstrations are single-turn answers)."""

  make: Callable[..., Environment]
  demonstration: Callable[[Task], Demonstration] | None = None


_SPECS: dict[str, EnvSpec] = {}


def _builtins() -> dict[str, EnvSpec]:
  from rlpt.envs import code_repair, python_tool
  return {"python_tool": EnvSpec(
              make=lambda pool, limits, with_tools=True: python_tool.PythonToolEnv(
                  pool, limits, with_tool=with_tools),
              demonstration=python_tool.demonstration),
          "code_repair": EnvSpec(
              make=lambda pool, limits, with_tools=True: code_repair.CodeRepairEnv(
                  pool, limits, with_tool=with_tools),
              demonstration=code_repair.demonstration)}


def register(domain: str, spec: EnvSpec) -> None:
  """Makes `domain` episodic, played by `spec` (replacing any earlier spec)."""
  if not isinstance(domain, str) or not domain:
    raise ValueError(f"envs.registry.register: domain must be a non-empty string, "
                     f"got {domain!r}")
  if not isinstance(spec, EnvSpec):
    raise TypeError(f"envs.registry.register({domain!r}): expected an EnvSpec, "
                    f"got {type(spec).__name__}")
  _SPECS[domain] = spec


def get(domain: str) -> EnvSpec | None:
  """The environment spec of an episodic domain; None for a single-turn one."""
  return _SPECS.get(domain) or _builtins().get(domain)


def is_episodic(domain: str) -> bool:
  return get(domain) is not None


def domains() -> list[str]:
  """Every episodic domain."""
  return sorted(set(_builtins()) | set(_SPECS))


def make(domain: str, pool: Any, limits: Any, *, with_tools: bool = True) -> Environment:
  spec = get(domain)
  if spec is None:
    raise KeyError(f"domain {domain!r} has no environment (it is single-turn)")
  return spec.make(pool, limits, with_tools=with_tools)
