"""Workdir layout and the config.json guard that makes a workdir resumable.

A workdir holds:
  config.json       the resolved config of the run that created it
  checkpoints/      Orbax checkpoints
  trajectories/     every trajectory, as Parquet
  dead_letter/      groups the round scheduler gave up on, same layout, with the reason
  tb/               TensorBoard event files
  metrics.jsonl     one JSON object per step
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import ml_collections


class WorkdirConfigMismatch(RuntimeError):
  """The workdir was created by a different config."""


@dataclasses.dataclass(frozen=True)
class Workdir:
  root: str

  @property
  def config_json(self) -> str:
    return os.path.join(self.root, "config.json")

  @property
  def checkpoints(self) -> str:
    return os.path.join(self.root, "checkpoints")

  @property
  def trajectories(self) -> str:
    return os.path.join(self.root, "trajectories")

  @property
  def dead_letter(self) -> str:
    return os.path.join(self.root, "dead_letter")

  @property
  def tb(self) -> str:
    return os.path.join(self.root, "tb")

  @property
  def metrics_jsonl(self) -> str:
    return os.path.join(self.root, "metrics.jsonl")

  @property
  def weights(self) -> str:
    return os.path.join(self.root, "weights")


def default_workdir(config_spec: str) -> str:
  """runs/<config file stem>[_<arg>] for `--config=path/NAME.py[:ARG]`."""
  name = os.path.splitext(os.path.basename(config_spec.partition(":")[0]))[0]
  arg = config_spec.partition(":")[2]
  return os.path.join("runs", name + (f"_{arg}" if arg else ""))


def config_to_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """A JSON-safe plain dict of `config` (non-JSON leaves become their repr)."""
  return json.loads(config.to_json_best_effort(sort_keys=True))


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for k in sorted(set(a) | set(b)):
      key = f"{prefix}.{k}" if prefix else k
      if k not in a:
        out.append(f"{key}: (absent) -> {b[k]!r}")
      elif k not in b:
        out.append(f"{key}: {a[k]!r} -> (absent)")
      else:
        out.extend(_diff(a[k], b[k], key))
    return out
  return [] if a == b else [f"{prefix}: {a!r} -> {b!r}"]


def prepare_workdir(root: str, config: ml_collections.ConfigDict, *,
                    allow_config_change: bool = False,
                    ignore_keys: tuple[str, ...] = ("total_steps",)) -> Workdir:
  """Creates the workdir layout and writes (or checks) config.json.

  A workdir that already holds a config.json from a different config is refused
  (a resume would silently mix two experiments) unless `allow_config_change`;
  keys in `ignore_keys` (e.g. extending `total_steps`) may always change.

  Raises:
    WorkdirConfigMismatch: naming every differing field.
  """
  wd = Workdir(os.path.abspath(root))
  for d in (wd.root, wd.checkpoints, wd.trajectories, wd.tb):
    os.makedirs(d, exist_ok=True)
  new = config_to_dict(config)
  if os.path.exists(wd.config_json):
    with open(wd.config_json) as f:
      old = json.load(f)
    diffs = [d for d in _diff(old, new) if d.split(":")[0] not in ignore_keys]
    if diffs and not allow_config_change:
      raise WorkdirConfigMismatch(
          f"{wd.config_json} was written by a different config; refusing to resume.\n  "
          + "\n  ".join(diffs[:20])
          + "\nUse a new --workdir, or pass --allow_config_change to resume anyway.")
  tmp = wd.config_json + ".tmp"
  with open(tmp, "w") as f:
    json.dump(new, f, indent=2, sort_keys=True)
  os.replace(tmp, wd.config_json)
  return wd
