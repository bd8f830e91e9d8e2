"""A small name -> function registry, one per kind of algorithm piece.

    ADVANTAGES = Registry("advantage")

    @ADVANTAGES.register("group_norm")
    def group_norm(...): ...

    fn = ADVANTAGES.get(config.rl.advantage)   # ValueError naming the choices
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
  """Functions of one kind (advantage, policy loss, ...) registered by name."""

  def __init__(self, kind: str):
    self.kind = kind
    self._fns: dict[str, Callable] = {}

  def register(self, name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
      if name in self._fns:
        raise ValueError(f"{self.kind} {name!r} registered twice")
      self._fns[name] = fn
      return fn
    return deco

  def get(self, name: str) -> Callable:
    if name not in self._fns:
      near = difflib.get_close_matches(name, list(self._fns), n=1)
      hint = f"; did you mean {near[0]!r}?" if near else ""
      raise ValueError(f"unknown {self.kind} {name!r}{hint} "
                       f"(registered: {', '.join(sorted(self._fns))})")
    return self._fns[name]

  def names(self) -> list[str]:
    return sorted(self._fns)

  def __contains__(self, name: str) -> bool:
    return name in self._fns

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())
