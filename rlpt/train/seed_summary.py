"""The several-seed table: one run per seed (`launch.train --seeds=0,1,2`), each in its
own workdir, summarised per domain from the runs' evals.json files.

    header, rows, report = summarize(["runs/default/seed_0", "runs/default/seed_1", ...])

Per domain: each seed's start accuracy (after SFT, step 0), final accuracy and the
paired gain with its 95 % interval (rlpt.train.intervals.paired_gain), then the mean
and the spread (sample standard deviation) of the gains over the seeds, and how many
seeds gained with the interval's lower end above 0.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from rlpt.train import intervals


def read_evals(workdir: str) -> dict[int, dict[str, Any]]:
  """{step: {domain: evaluation}} from WORKDIR/evals.json (ValueError naming the file
  when it is missing or has no evaluations)."""
  path = os.path.join(workdir, "evals.json")
  if not os.path.exists(path):
    raise ValueError(f"{path}: no evals.json (has the run finished?)")
  with open(path) as f:
    raw = json.load(f)
  out = {int(k): v["domains"] for k, v in raw.items() if k.lstrip("-").isdigit()}
  if not out:
    raise ValueError(f"{path}: no evaluations in the file")
  return out


def seed_gains(workdir: str) -> dict[str, dict[str, Any]]:
  """{domain: {"start", "final": Interval, "gain": Interval | None, "final_step"}} of one run."""
  ev = read_evals(workdir)
  last = max(ev)
  if last <= 0 or 0 not in ev:
    raise ValueError(f"{os.path.join(workdir, 'evals.json')}: needs the step-0 evaluation "
                     f"and one after RL (steps found: {sorted(ev)})")
  out = {}
  for d, e in ev[last].items():
    s = ev[0].get(d)
    if s is None:
      continue
    gain = None
    if e.get("correct") is not None and s.get("correct") is not None:
      gain = intervals.paired_gain_scored(e["correct"], s["correct"])
    out[d] = {"start": intervals.wilson(round(s["accuracy"] * s["n"]), s["n"]),
              "final": intervals.wilson(round(e["accuracy"] * e["n"]), e["n"]),
              "gain": gain, "final_step": last}
  return out


def summarize(workdirs: Sequence[str], labels: Sequence[str] | None = None
              ) -> tuple[list[str], list[list[str]], dict[str, Any]]:
  """(header, rows, report) of the several-seed table (see the module docstring);
  report is JSON-ready: {domain: {"seeds": {label: {...}}, "gain_mean", "gain_std",
  "seeds_significant"}}."""
  labels = list(labels) if labels is not None else [os.path.basename(w) for w in workdirs]
  per_seed = [seed_gains(w) for w in workdirs]
  domains = sorted(set().union(*[set(g) for g in per_seed]))
  header = (["domain"] + [f"{lab}: start -> final, gain [95 %]" for lab in labels]
            + ["gain mean +- sd", "seeds with gain > 0 (95 %)"])
  rows, report = [], {}
  for d in domains:
    row, gains, sig, seeds = [d], [], 0, {}
    for lab, g in zip(labels, per_seed):
      if d not in g:
        row.append("-")
        continue
      e = g[d]
      gain = e["gain"]
      txt = f"{100 * e['start'].estimate:.1f} -> {100 * e['final'].estimate:.1f}"
      if gain is not None:
        txt += f", {gain.format(signed=True)}"
        gains.append(gain.estimate)
        sig += int(gain.low > 0)
      row.append(txt)
      seeds[lab] = {"start": e["start"].to_dict(), "final": e["final"].to_dict(),
                    "gain": None if gain is None else gain.to_dict()}
    if gains:
      m, sd = intervals.mean_and_spread(gains)
      row += [f"{100 * m:+.1f} +- {100 * sd:.1f}", f"{sig} of {len(gains)}"]
    else:
      m = sd = float("nan")
      row += ["-", "-"]
    rows.append(row)
    report[d] = {"seeds": seeds, "gain_mean": m, "gain_std": sd, "seeds_significant": sig}
  return header, rows, report
