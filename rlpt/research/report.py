"""The report of a sweep (or of one run): a Markdown table and PNG charts.

    arms = [ArmRuns("dapo", {0: load_run(".../dapo/seed_0"), 1: ...}), ...]
    write_report("runs/sweeps/dapo", arms, title="...")   # report.md + *.png beside it

Table, one row per arm (seeds pooled as mean +- sample standard deviation):
final holdout accuracy per domain (%, the last evaluation), training reward,
response length of correct (score 1) and incorrect answers (tokens), clip fraction and
KL to the reference policy (each the mean over a run's last fifth of steps), wall
time (minutes) and status (a failed seed names its error; the other seeds still count).
Past MAX_DOMAIN_COLUMNS domains the holdout columns are left out; one run's report
(`write_run`) then ends with every domain's change from step 0 to its last
evaluation, with the paired 95 % interval (rlpt.train.intervals), largest gain first.

Charts, every arm in one colour across all of them (its index in the sweep's order):
reward.png (training reward per step), holdout.png (accuracy per domain over steps; the
MAX_DOMAIN_COLUMNS that moved most where there are more),
response_length.png (correct solid, incorrect dashed), entropy.png (per-token entropy
of the trained samples). Lines are means over seeds, bands their min-max; curves
longer than 60 steps are trailing rolling means over a 40th of their steps.
"""

from __future__ import annotations

import dataclasses
import math
import json
import os
import warnings
from typing import Sequence

import numpy as np

from rlpt.research.runs import Run, load_run
from rlpt.train import intervals

# (column, metrics key): the quantities averaged over a run's last fifth of steps
QUANTITIES = (("reward", "reward_mean"), ("len correct", "response_len/correct"),
              ("len incorrect", "response_len/incorrect"), ("clip frac", "clip_frac"),
              ("KL", "kl"))
CHARTS = ("reward.png", "holdout.png", "response_length.png", "entropy.png")
# More domains than this: the table leaves out per-domain holdout columns and the
# holdout chart shows the domains that moved most (one run's change table has them all).
MAX_DOMAIN_COLUMNS = 8


@dataclasses.dataclass
class ArmRuns:
  """One arm's runs, by seed."""
  name: str
  runs: dict[int, Run]

  def done(self) -> list[Run]:
    return [r for _, r in sorted(self.runs.items()) if r.status == "done"]

  def status(self) -> str:
    """"done" / "3 of 3 done" / "failed: seed 1: ValueError: ..." (errors first)."""
    fails = [(s, r.failure) for s, r in sorted(self.runs.items()) if r.status == "failed"]
    if fails:
      s, f = fails[0]
      more = f" (+{len(fails) - 1} more)" if len(fails) > 1 else ""
      return f"failed: seed {s}: {f.get('error', 'unknown error')}{more}"
    n = len(self.done())
    return "done" if n == len(self.runs) else f"{n} of {len(self.runs)} done"


def _mean_sd(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
  v = np.asarray([x for x in values if math.isfinite(x)], np.float64) * scale
  if not v.size:
    return "-"
  if v.size == 1:
    return f"{v[0]:.{digits}f}"
  return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def arm_summary(arm: ArmRuns) -> dict[str, list[float]]:
  """{column: [one value per finished seed]} for the table (holdout as fractions)."""
  runs = arm.done()
  out: dict[str, list[float]] = {}
  for r in runs:
    for d, acc in r.holdout().items():
      out.setdefault(f"holdout {d}", []).append(acc)
  for col, key in QUANTITIES:
    vals = [r.final(key) for r in runs]
    # No reference policy (rl.kl_coef 0): the KL is not measured, its metric reads 0.
    if key == "kl" and all(v == 0.0 for v in vals):
      vals = [math.nan] * len(vals)
    out[col] = vals
  out["wall (min)"] = [r.wall_s / 60 for r in runs]
  return out


def table(arms: Sequence[ArmRuns]) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the report table (see the module docstring)."""
  summaries = [arm_summary(a) for a in arms]
  domains = sorted({c for s in summaries for c in s if c.startswith("holdout ")})
  if len(domains) > MAX_DOMAIN_COLUMNS:
    domains = []
  cols = domains + [c for c, _ in QUANTITIES] + ["wall (min)"]
  header = ["arm", "seeds"] + [c + (" (%)" if c.startswith("holdout ") else "") for c in cols]
  header.append("status")
  rows = []
  for a, s in zip(arms, summaries):
    row = [a.name, ",".join(str(k) for k in sorted(a.runs))]
    for c in cols:
      scale = 100.0 if c.startswith("holdout ") else 1.0
      digits = 3 if c in ("reward", "clip frac", "KL") else 1
      row.append(_mean_sd(s.get(c, []), scale, digits))
    row.append(a.status())
    rows.append(row)
  return header, rows


def holdout_changes(run: Run) -> list[dict]:
  """Per domain evaluated at step 0 and later: {domain, before (step-0 accuracy),
  after (its last evaluation's), step (of that one), gain (intervals.Interval, paired
  over the same tasks)}, the largest gain first."""
  out = []
  start = run.evals.get(0, {})
  for d, e0 in start.items():
    later = [s for s, ev in run.evals.items() if s > 0 and d in ev]
    if not later or "correct" not in e0:
      continue
    e1 = run.evals[max(later)][d]
    gain = intervals.paired_gain_scored(e1.get("correct", []), e0["correct"])
    if gain is None:
      continue
    out.append({"domain": d, "before": float(e0["accuracy"]), "after": float(e1["accuracy"]),
                "step": max(later), "gain": gain})
  out.sort(key=lambda c: (-c["gain"].estimate, c["domain"]))
  return out


def changes_section(run: Run) -> str:
  """Markdown: how many domains rose or fell (paired 95 % interval clear of 0) and the
  table of every domain's change from step 0 to its last evaluation."""
  ch = holdout_changes(run)
  if not ch:
    return ""
  up = [c["domain"] for c in ch if c["gain"].low > 0]
  down = [c["domain"] for c in ch if c["gain"].high < 0]
  mean = float(np.mean([c["gain"].estimate for c in ch]))
  named = [f"{what}: {', '.join(ds)}" for what, ds in (("rose", up), ("fell", down)) if ds]
  lines = ["## Holdout change from step 0", "",
           f"{len(ch)} domains; mean change {100 * mean:+.1f} points; {len(up)} rose and "
           f"{len(down)} fell with the paired 95 % interval clear of 0"
           + (f" ({'; '.join(named)})" if named else "") + ".", ""]
  rows = [[c["domain"], f"{100 * c['before']:.1f}", f"{100 * c['after']:.1f}", str(c["step"]),
           c["gain"].format(signed=True)] for c in ch]
  lines.append(markdown_table(["domain", "step 0 (%)", "last (%)", "at step",
                               "change [95 %, paired]"], rows))
  return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  esc = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
  lines = ["| " + " | ".join(esc(h) for h in header) + " |",
           "| " + " | ".join("---" for _ in header) + " |"]
  lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
  return "\n".join(lines)


def _colour(i: int):
  import matplotlib
  return matplotlib.colormaps["tab10"](i % 10)


def _smooth(steps: np.ndarray, values: np.ndarray, points: int = 40
            ) -> tuple[np.ndarray, np.ndarray]:
  """A trailing rolling mean over len/points steps for curves longer than 1.5 x points
  (per-step RL metrics are noisy); shorter curves are returned as they are."""
  keep = np.isfinite(values)
  steps, values = steps[keep], values[keep]
  w = len(values) // points
  if len(values) < 1.5 * points or w < 2:
    return steps, values
  return steps[w - 1:], np.convolve(values, np.ones(w) / w, mode="valid")


def _band(ax, runs: Sequence[Run], get, colour, label, style="-"):
  """Plots the mean over runs of get(run) -> (steps, values) on the union of steps,
  with a min-max band; runs missing a step leave it out of that step's mean."""
  curves = [_smooth(*get(r)) for r in runs]
  curves = [(s, v) for s, v in curves if s.size]
  if not curves:
    return False
  steps = np.unique(np.concatenate([s for s, _ in curves]))
  grid = np.full((len(curves), steps.size), np.nan)
  for i, (s, v) in enumerate(curves):
    grid[i, np.searchsorted(steps, s)] = v
  with warnings.catch_warnings():   # a step no run holds is NaN, not a warning
    warnings.simplefilter("ignore", RuntimeWarning)
    mean, lo, hi = np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0)
  ax.plot(steps, mean, style, color=colour, label=label, lw=1.6)
  if len(curves) > 1:
    ax.fill_between(steps, lo, hi, color=colour, alpha=0.15, lw=0)
  return True


def plot(arms: Sequence[ArmRuns], outdir: str) -> list[str]:
  """Writes the four charts (CHARTS) into `outdir`; returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  os.makedirs(outdir, exist_ok=True)
  paths = []

  def save(fig, name):
    path = os.path.join(outdir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

  def runs_of(a):
    return [r for _, r in sorted(a.runs.items()) if r.rows]

  for name, key, ylabel in (("reward.png", "reward_mean", "training reward (mean)"),
                            ("entropy.png", "entropy", "entropy (nats / token)")):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, a in enumerate(arms):
      _band(ax, runs_of(a), lambda r, k=key: r.series(k), _colour(i), a.name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, name)

  domains = sorted({d for a in arms for r in a.runs.values() for d in r.domains})
  if len(domains) > MAX_DOMAIN_COLUMNS:
    first = next((r for a in arms for _, r in sorted(a.runs.items()) if r.evals), None)
    moved = holdout_changes(first) if first is not None else []
    moved.sort(key=lambda c: -abs(c["gain"].estimate))
    domains = sorted(c["domain"] for c in moved[:MAX_DOMAIN_COLUMNS])
  fig, axes = plt.subplots(1, max(1, len(domains)), figsize=(4.2 * max(1, len(domains)), 3.8),
                           squeeze=False)
  for ax, d in zip(axes[0], domains or [None]):
    if d is None:
      ax.text(0.5, 0.5, "no holdout evaluated", ha="center", va="center",
              transform=ax.transAxes)
      continue
    for i, a in enumerate(arms):
      _band(ax, runs_of(a) or list(a.runs.values()),
            lambda r, d=d: (r.holdout_series(d)[0], 100 * r.holdout_series(d)[1]),
            _colour(i), a.name, style="o-")
    ax.set_title(d, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("holdout accuracy (%)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  save(fig, "holdout.png")

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for i, a in enumerate(arms):
    _band(ax, runs_of(a), lambda r: r.series("response_len/correct"), _colour(i),
          f"{a.name}, correct")
    _band(ax, runs_of(a), lambda r: r.series("response_len/incorrect"), _colour(i),
          f"{a.name}, incorrect", style="--")
  ax.set_xlabel("step")
  ax.set_ylabel("response length (tokens)")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  save(fig, "response_length.png")
  return paths


def write_report(outdir: str, arms: Sequence[ArmRuns], title: str, intro: str = "") -> str:
  """Writes OUTDIR/report.md (title, intro, the table, the charts) and the charts;
  returns the report's path."""
  header, rows = table(arms)
  charts = plot(arms, outdir)
  parts = [f"# {title}", ""]
  if intro:
    parts += [intro, ""]
  parts += [markdown_table(header, rows), "",
            "Holdout: accuracy at each run's last evaluation. Reward, response lengths "
            "(tokens; correct = full marks), clip fraction and KL (to the reference "
            "policy; '-' where the run has none): means over each run's last fifth of "
            "steps. Cells are the mean ± standard deviation over the finished seeds.", ""]
  parts += [f"![{os.path.splitext(os.path.basename(p))[0]}]({os.path.basename(p)})"
            for p in charts]
  path = os.path.join(outdir, "report.md")
  with open(path + ".tmp", "w") as f:
    f.write("\n".join(parts) + "\n")
  os.replace(path + ".tmp", path)
  return path


def sweep_arms(root: str) -> tuple[dict, list[ArmRuns]]:
  """(ROOT/sweep.json, the arms' runs) of a sweep directory written by launch.ablate."""
  path = os.path.join(root, "sweep.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: not a sweep directory (launch.ablate writes sweep.json)")
  with open(path) as f:
    spec = json.load(f)
  arms = []
  for a in spec["arms"]:
    runs = {}
    for seed in spec["seeds"]:
      d = os.path.join(root, a["name"], f"seed_{seed}")
      runs[int(seed)] = load_run(d) if os.path.isdir(d) else Run(d, [], {})
    arms.append(ArmRuns(a["name"], runs))
  return spec, arms


def write_sweep(root: str) -> tuple[str, list[str], list[list[str]]]:
  """ROOT/report.md and its charts for a sweep; returns (path, header, rows)."""
  spec, arms = sweep_arms(root)
  lines = [f"Sweep `{spec['sweep']}` on `{spec['base']}`, seeds {spec['seeds']}."]
  if spec.get("common"):
    lines.append("Every arm: " + ", ".join(f"`{k}={v!r}`" for k, v in spec["common"].items())
                 + ".")
  lines.append("Arms: " + "; ".join(
      f"**{a['name']}** " + (", ".join(f"`{k}={v!r}`" for k, v in a["overrides"].items())
                              or "(the base)") for a in spec["arms"]) + ".")
  path = write_report(root, arms, f"Sweep {os.path.basename(os.path.normpath(root))}",
                      "\n\n".join(lines))
  header, rows = table(arms)
  return path, header, rows


def write_run(workdir: str) -> tuple[str, list[str], list[list[str]]]:
  """WORKDIR/report/report.md and its charts for one run; returns (path, header, rows)."""
  run = load_run(workdir)
  if run.result is None and run.rows:   # a launch.train run: finished when it has steps
    run.result = {"wall_s": run.wall_s}
  name = os.path.basename(os.path.normpath(workdir))
  arms = [ArmRuns(name, {0: run})]
  path = write_report(os.path.join(workdir, "report"), arms, f"Run {name}",
                      f"Workdir `{workdir}`, {run.steps} steps.")
  extra = changes_section(run)
  if extra:
    with open(path, "a") as f:
      f.write("\n" + extra + "\n")
  header, rows = table(arms)
  return path, header, rows
