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

import dataclasses
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


def summarize_run(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
  """The end-of-run summary of per-step metrics rows (as in metrics.jsonl; a step
  written twice, e.g. around a resume, counts once, its last row): steps, wall time
  and its split (rollout / verify / train / weight sync / the rest: evals,
  checkpoints, data), reward over the first and the last k steps overall and per
  domain (k = min(5, steps // 3), at least 1), mean response length, the largest
  |rollout - learner| logprob gap, the groups dynamic sampling dropped, the groups the
  round scheduler dead-lettered and the failed attempts it retried, and in async
  mode the engine's and the learner's busy fractions, staleness and the group counts
  (the rollout / verify split then counts the producers' overlapped time, and the
  learner's own split is its wait for data, train, weight sync and the rest).
  Returns (name, value) rows; [] without rows."""
  by_step = {int(r["step"]): r for r in rows if "step" in r}
  if not by_step:
    return []
  steps = [by_step[s] for s in sorted(by_step)]
  n = len(steps)
  total = lambda key: sum(float(r.get(key, 0.0)) for r in steps)  # noqa: E731
  wall = total("time/step_s")
  out = [("steps", f"{n}"), ("wall time", f"{wall / 60:.1f} min")]
  # (name, key, part of the learner's own step time)
  parts = [("rollout", "time/rollout_s", True), ("verify", "time/verify_s", True),
           ("train", "time/train_s", True), ("weight sync", "time/sync_s", True)]
  if any("async/engine_busy" in r for r in steps):
    # the producers' rollout and verify overlap the learner, which waits for data instead
    parts = [("rollout (producers, overlapped)", "time/rollout_s", False),
             ("verify (producers, overlapped)", "time/verify_s", False),
             ("learner waiting for data", "time/wait_s", True),
             ("train", "time/train_s", True), ("weight sync", "time/sync_s", True)]
  spent = 0.0
  for name, key, own in parts:
    t = total(key)
    spent += t if own else 0.0
    out.append((f"  {name}", f"{t:.0f} s ({100 * t / max(wall, 1e-9):.0f} %)"))
  rest = max(wall - spent, 0.0)
  out.append(("  evals, checkpoints, data", f"{rest:.0f} s ({100 * rest / max(wall, 1e-9):.0f} %)"))
  k = max(1, min(5, n // 3))

  def mean(key, part):
    vals = [float(r[key]) for r in part if key in r]
    return f"{np.mean(vals):.3f}" if vals else "-"

  out.append((f"reward, first {k} -> last {k} steps",
              f"{mean('reward_mean', steps[:k])} -> {mean('reward_mean', steps[-k:])}"))
  domains = sorted({key.split("/", 1)[1] for r in steps for key in r
                    if key.startswith("reward_mean/")})
  for d in domains:
    key = f"reward_mean/{d}"
    out.append((f"  {d}", f"{mean(key, steps[:k])} -> {mean(key, steps[-k:])}"))
  out.append(("response length (mean tokens)", mean("response_len", steps)))
  gaps = [float(r["logprob_gap_max"]) for r in steps if "logprob_gap_max" in r]
  if gaps:
    out.append(("max |rollout - learner logprob|", f"{max(gaps):.2e}"))
  if any("dropped_groups" in r for r in steps):
    out.append(("groups dropped (dynamic sampling)", f"{total('dropped_groups'):.0f}"))
  if any(r.get("dead_letter_groups") or r.get("retried_attempts") for r in steps):
    out.append(("groups dead-lettered (WORKDIR/dead_letter/)",
                f"{total('dead_letter_groups'):.0f}"))
    out.append(("failed attempts retried", f"{total('retried_attempts'):.0f}"))
  last = steps[-1]
  if "async/engine_busy" in last:  # rl.mode = "async": the overlap and the group counts
    out.append(("engine busy (async)", f"{100 * float(last['async/engine_busy']):.0f} %"))
    out.append(("learner busy (train + sync)",
                f"{100 * float(last['async/learner_busy']):.0f} %"))
    out.append(("staleness (mean, max versions)",
                f"{mean('staleness', steps)}, "
                f"{max(float(r.get('staleness_max', 0)) for r in steps):.0f}"))
    out.append(("groups generated = trained + filtered + stale + dead-lettered + buffered",
                " = ".join([f"{last['async/generated_groups']:.0f}",
                            " + ".join(f"{last.get(f'async/{k}_groups', 0):.0f}"
                                       for k in ("trained", "filtered", "stale", "dead_letter",
                                                 "buffered"))])))
  verdict = learning_verdict([float(r["reward_mean"]) for r in steps if "reward_mean" in r])
  if verdict is not None:
    out.append(("learning", verdict.describe()))
  return out


@dataclasses.dataclass(frozen=True)
class LearningVerdict:
  """Whether the training reward rose: the least-squares line through every step's mean
  reward, its rise from the first step to the last against the 95 % band of that rise
  (from the residual spread around the line). The first and last fifths' means are
  shown beside it.

  The line uses every step; comparing the two fifths alone leaves 3 steps a side in a
  16-step run, whose spread made the band so wide (+-0.12 reward) that runs gaining
  +12 to +26 holdout points were flagged as not learning (docs/benchmarks.md, issue 26).
  """

  first: float   # mean reward, first fifth of the steps
  last: float    # mean reward, last fifth
  rise: float    # fitted slope x (steps - 1)
  noise: float   # 1.96 x its standard error
  steps: int

  @property
  def learning(self) -> bool:
    return self.rise > self.noise

  def describe(self) -> str:
    what = "yes" if self.learning else "NOT LEARNING"
    return (f"{what}: reward first fifth {self.first:.3f} -> last fifth {self.last:.3f}, "
            f"fitted rise over {self.steps} steps {self.rise:+.3f} (noise +-{self.noise:.3f})")


def learning_verdict(rewards: list[float]) -> LearningVerdict | None:
  """The verdict on per-step mean rewards (step order); None under 10 steps, too few
  for a line and its band to say much."""
  n = len(rewards)
  if n < 10:
    return None
  y = np.asarray(rewards, np.float64)
  t = np.arange(n, dtype=np.float64) - (n - 1) / 2
  slope = float(t @ (y - y.mean()) / (t @ t))
  resid = y - y.mean() - slope * t
  se = float(np.sqrt(resid @ resid / (n - 2) / (t @ t)))
  k = n // 5
  return LearningVerdict(float(y[:k].mean()), float(y[-k:].mean()), slope * (n - 1),
                         1.96 * se * (n - 1), n)
