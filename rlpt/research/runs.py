"""One run's record, read back from its workdir for tables, charts and review.

    run = load_run("runs/smoke")
    steps, reward = run.series("reward_mean")       # float[S] each, step order
    run.final("clip_frac")                          # mean over the last fifth of steps
    run.holdout()                                   # {domain: accuracy} at the last evaluation
    rows = run.trajectories(columns=["step", "reward", "completion_text"])

Reads what the RL loop writes (rlpt.train.workdir): metrics.jsonl (one row per step;
a resumed run truncated the rows past its checkpoint, and the last row of a step wins
here too), evals.json (holdout accuracy per domain at each evaluated step),
trajectories/*.parquet, and the files `launch.ablate` adds beside them: result.json
(a finished run: its wall time) and failed.json (a run that crashed: its error).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from rlpt.train import seed_summary

RESULT, FAILED = "result.json", "failed.json"


def _number(v: Any) -> float:
  """A metrics value as float (the writer stores NaN and inf as strings)."""
  try:
    return float(v)
  except (TypeError, ValueError):
    return math.nan


@dataclasses.dataclass
class Run:
  """A run's metrics, evaluations and status (see the module docstring)."""

  workdir: str
  rows: list[dict[str, Any]]                     # metrics.jsonl, one per step, step order
  evals: dict[int, dict[str, dict[str, Any]]]    # {step: {domain: evaluation}}
  result: dict[str, Any] | None = None
  failure: dict[str, Any] | None = None

  @property
  def status(self) -> str:
    """"done" (result.json), "failed" (failed.json), "partial" (some steps) or "pending"."""
    if self.result is not None:
      return "done"
    if self.failure is not None:
      return "failed"
    return "partial" if self.rows else "pending"

  @property
  def steps(self) -> int:
    return int(self.rows[-1]["step"]) if self.rows else 0

  def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps int[S], values float[S]) of the rows that hold `key`."""
    pairs = [(int(r["step"]), _number(r[key])) for r in self.rows if key in r]
    if not pairs:
      return np.zeros(0, np.int64), np.zeros(0)
    s, v = zip(*pairs)
    return np.asarray(s, np.int64), np.asarray(v, np.float64)

  def final(self, key: str) -> float:
    """Mean of `key` over the last fifth of the steps that hold it (at least one step;
    NaN when none does): the run's end state, less noisy than its last step."""
    _, v = self.series(key)
    v = v[np.isfinite(v)]
    if not v.size:
      return math.nan
    return float(v[-max(1, v.size // 5):].mean())

  def holdout(self) -> dict[str, float]:
    """{domain: accuracy (fraction)} at the last evaluated step after RL began ({} when
    the run has no holdout or was not evaluated after step 0)."""
    later = [s for s in self.evals if s > 0]
    if not later:
      return {}
    return {d: float(e["accuracy"]) for d, e in sorted(self.evals[max(later)].items())}

  def holdout_series(self, domain: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, accuracy) of `domain` at every evaluation from step 0 on."""
    pts = sorted((s, float(e[domain]["accuracy"])) for s, e in self.evals.items()
                 if s >= 0 and domain in e)
    if not pts:
      return np.zeros(0, np.int64), np.zeros(0)
    s, v = zip(*pts)
    return np.asarray(s, np.int64), np.asarray(v)

  @property
  def domains(self) -> list[str]:
    return sorted({d for e in self.evals.values() for d in e})

  @property
  def wall_s(self) -> float:
    """The finished run's wall time (result.json: every attempt that ended, set-up
    included); else the sum of its steps' times."""
    if self.result is not None and "wall_s" in self.result:
      return float(self.result["wall_s"])
    _, t = self.series("time/step_s")
    return float(np.nansum(t)) if t.size else math.nan

  def trajectories(self, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every recorded trajectory (trajectories/step_*.parquet), as rows in step order."""
    import pyarrow.parquet as pq
    out = []
    for path in sorted(glob.glob(os.path.join(self.workdir, "trajectories", "step_*.parquet"))):
      out.extend(pq.read_table(path, columns=list(columns) if columns else None).to_pylist())
    return out


def _read_json(path: str) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def read_metrics(path: str) -> list[dict[str, Any]]:
  """metrics.jsonl's rows, one per step in step order (the last row of a step wins);
  ValueError naming the file and line for a line that is not JSON."""
  by_step: dict[int, dict[str, Any]] = {}
  if os.path.exists(path):
    with open(path) as f:
      for i, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
          by_step[int(row["step"])] = row
        except (ValueError, KeyError, TypeError) as e:
          raise ValueError(f"{path}:{i}: not a metrics row with a step ({e})") from e
  return [by_step[s] for s in sorted(by_step)]


def load_run(workdir: str) -> Run:
  """The run in `workdir` (FileNotFoundError when it is not a directory)."""
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"{workdir}: no such run directory")
  evals = {}
  if os.path.exists(os.path.join(workdir, "evals.json")):
    try:
      evals = seed_summary.read_evals(workdir)
    except ValueError:
      evals = {}
  return Run(workdir=workdir, rows=read_metrics(os.path.join(workdir, "metrics.jsonl")),
             evals=evals, result=_read_json(os.path.join(workdir, RESULT)),
             failure=_read_json(os.path.join(workdir, FAILED)))
