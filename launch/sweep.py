"""Sweep files: named arms of config overrides on one base experiment config.

A sweep file is a config file like the experiment configs (`get_config(arg=None)`,
`--sweep=FILE:ARG`) whose ConfigDict has

    base     "configs/NAME.py[:ARG]", the experiment every arm starts from
    seeds    the default seeds (tuple of int; `launch.ablate --seeds` replaces them)
    common   overrides applied to every arm first (nested dicts: ConfigDict refuses
             dotted keys at its top level)
    arms     a tuple of (name, overrides) pairs, in the order of the report's rows and
             colours; overrides a dict of dotted paths ("rl.clip_eps_high") or nested
             dicts ({"rl": {"clip_eps_high": 0.28}})

Every override must name a field the base config has, with a value its type accepts;
`check` builds the config of every arm x seed and reads it into typed settings, so a
bad arm is refused before any run starts, naming the arm and the field.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping, Sequence

import ml_collections

from launch import config_cli

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class SweepError(Exception):
  """A sweep file or one of its arms is unusable; the message names the file, the arm
  and the field."""


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  overrides: tuple[tuple[str, Any], ...]   # (dotted path, value), applied in order


@dataclasses.dataclass(frozen=True)
class Sweep:
  path: str                                # the sweep file (and ":ARG")
  base: str                                # configs/NAME.py[:ARG]
  seeds: tuple[int, ...]
  common: tuple[tuple[str, Any], ...]
  arms: tuple[Arm, ...]

  @property
  def name(self) -> str:
    stem = os.path.splitext(os.path.basename(self.path.partition(":")[0]))[0]
    arg = self.path.partition(":")[2]
    return stem + (f"_{arg}" if arg else "")

  def arm(self, name: str) -> Arm:
    for a in self.arms:
      if a.name == name:
        return a
    raise SweepError(f"sweep '{self.path}' has no arm {name!r} (arms: "
                     f"{', '.join(a.name for a in self.arms)})")

  def to_json(self) -> dict[str, Any]:
    return {"sweep": self.path, "base": self.base, "seeds": list(self.seeds),
            "common": {k: _jsonable(v) for k, v in self.common},
            "arms": [{"name": a.name, "overrides": {k: _jsonable(v) for k, v in a.overrides}}
                     for a in self.arms]}


def _jsonable(v: Any) -> Any:
  return list(v) if isinstance(v, tuple) else v


def _flatten(where: str, d: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """[(dotted path, value)] of a dict of overrides (nested dicts or dotted keys)."""
  if isinstance(d, ml_collections.ConfigDict):
    d = d.to_dict()
  if not isinstance(d, Mapping):
    raise SweepError(f"{where}: overrides must be a dict of config fields, got "
                     f"{type(d).__name__}")
  out = []
  for k, v in d.items():
    path = f"{prefix}{k}"
    if isinstance(v, (Mapping, ml_collections.ConfigDict)) and v:
      out.extend(_flatten(where, v, path + "."))
    else:
      out.append((path, v))
  return out


def load(spec: str) -> Sweep:
  """Reads the sweep file `path[:arg]` (SweepError naming the file and the field)."""
  try:
    raw = config_cli.load_config_file(spec)
  except config_cli.ConfigError as e:
    raise SweepError(f"sweep file: {e}") from e
  path = spec.partition(":")[0]
  missing = [k for k in ("base", "arms") if k not in raw]
  if missing:
    raise SweepError(f"sweep file '{path}' has no {' or '.join(missing)} (see launch/sweep.py)")
  if not isinstance(raw.base, str):
    raise SweepError(f"sweep file '{path}': base must be 'configs/NAME.py[:ARG]', "
                     f"got {raw.base!r}")
  seeds = tuple(raw.get("seeds", (0,)))
  if not seeds or not all(isinstance(s, int) for s in seeds):
    raise SweepError(f"sweep file '{path}': seeds must be a non-empty tuple of int, "
                     f"got {seeds!r}")
  common = tuple(_flatten(f"sweep file '{path}', common", raw.get("common", {}) or {}))
  arms, seen = [], set()
  for i, pair in enumerate(raw.arms):
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)):
      raise SweepError(f"sweep file '{path}': arms[{i}] must be a (name, overrides) pair, "
                       f"got {pair!r}")
    name, overrides = pair
    if not _NAME.match(name) or name in seen:
      raise SweepError(f"sweep file '{path}': arm name {name!r} must be unique and made of "
                       "letters, digits and _.+- (it names a directory)")
    seen.add(name)
    arms.append(Arm(name, tuple(_flatten(f"sweep file '{path}', arm {name!r}", overrides))))
  if not arms:
    raise SweepError(f"sweep file '{path}' has no arms")
  return Sweep(spec, raw.base, seeds, common, tuple(arms))


def _set(cfg: ml_collections.ConfigDict, path: str, value: Any, where: str) -> None:
  valid = config_cli.leaf_paths(cfg)
  if path not in valid:
    raise SweepError(config_cli.unknown_field_message(path, valid, where))
  *parents, leaf = path.split(".")
  node = cfg
  for p in parents:
    node = node[p]
  old = node[leaf]
  try:
    node[leaf] = value
  except (TypeError, ValueError) as e:
    raise SweepError(f"config field '{path}' ({where}) expects {type(old).__name__} "
                     f"(default {old!r}), got {value!r}: {e}") from e


def arm_config(sweep: Sweep, arm: Arm, seed: int,
               base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """The base config with the sweep's common overrides, the arm's and the seed."""
  cfg = config_cli.load_config_file(sweep.base) if base is None else base
  cfg = ml_collections.ConfigDict(cfg.to_dict())   # a copy, type-safe like the file's
  where = f"sweep '{sweep.path}', arm {arm.name!r}, base '{sweep.base}'"
  for path, value in sweep.common:
    _set(cfg, path, value, f"sweep '{sweep.path}', common overrides, base '{sweep.base}'")
  for path, value in arm.overrides:
    _set(cfg, path, value, where)
  _set(cfg, "seed", int(seed), where)
  return cfg


def check(sweep: Sweep, seeds: Sequence[int]) -> None:
  """Builds and reads every arm x seed config (SweepError naming the first bad arm)."""
  from rlpt.train import settings
  try:
    base = config_cli.load_config_file(sweep.base)
  except config_cli.ConfigError as e:
    raise SweepError(f"sweep '{sweep.path}': base: {e}") from e
  for arm in sweep.arms:
    for seed in seeds:
      cfg = arm_config(sweep, arm, seed, base)
      try:
        settings.Settings.from_config(cfg)
      except settings.ConfigError as e:
        raise SweepError(f"sweep '{sweep.path}', arm {arm.name!r}: {e}") from e
