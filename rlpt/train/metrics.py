"""One writer for per-step metrics: `metrics.jsonl` and TensorBoard.

    writer = MetricsWriter(workdir)
    writer.write(step, {"loss": 0.3, "reward_mean": 0.5, "reward_mean/math": 0.4})
    writer.close()

Every call appends one JSON line `{"step": step, **metrics}` (flushed, so a crash
loses nothing written) and logs every scalar to TensorBoard under its key. On
resume, `truncate_after(step)` drops lines of steps past the restored checkpoint
so no step is counted twice.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from typing import Any, Mapping

import numpy as np


def _to_python(v: Any) -> Any:
  if isinstance(v, (np.generic,)):
    v = v.item()
  elif hasattr(v, "shape") and getattr(v, "shape", None) == ():
    v = np.asarray(v).item()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)  # JSON has no NaN/inf; keep it visible rather than dropping it
  return v


class MetricsWriter:
  """Appends per-step metrics to WORKDIR/metrics.jsonl and WORKDIR/tb."""

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._file = open(self.path, "a")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # deferred: heavy import
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    row = {"step": int(step)}
    row.update({k: _to_python(v) for k, v in metrics.items()})
    self._file.write(json.dumps(row, sort_keys=True) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in row.items():
        if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool):
          self._tb.add_scalar(k, float(v), global_step=int(step))
      self._tb.flush()

  def truncate_after(self, step: int) -> int:
    """Drops rows with row["step"] > step; returns how many were dropped."""
    self._file.close()
    rows = read_metrics(self.path)
    keep = [r for r in rows if r["step"] <= step]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in keep:
        f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, self.path)
    self._file = open(self.path, "a")
    return len(rows) - len(keep)

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
  """Reads metrics.jsonl; a torn last line (crash mid-write) is skipped."""
  if os.path.isdir(path):
    path = os.path.join(path, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return rows
