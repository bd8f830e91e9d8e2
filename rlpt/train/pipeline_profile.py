"""A run's profile for the pipeline planner (`python -m launch.plan async`): the
compact record of a run's loop settings, per-step stage times and response-length
groups; the costs fitted from it; the prediction of a cluster shape by simulation
(rlpt.train.pipeline_sim); and the report beside the measured figures.

    profile = load_run(WORKDIR)                # metrics.jsonl + trajectories/ + config.json
    costs = fit_costs(profile, warmup=2)       # per-stage seconds (pipeline_sim.Costs)
    pred = predict(profile, shape=pipeline_sim.Shape(members=8), overrides={}, steps=6,
                   warmup=2, replicas=20, seed=0)
    print(report(pred, [measured(profile, warmup=2)]))
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from rlpt.train import pipeline_sim as ps


REQUIRED = ("time/rollout_s", "time/verify_s", "time/train_s", "time/sync_s", "time/step_s")
PIPELINE_FIELDS = {"mode": "rl.mode", "prompts_per_step": "data.prompts_per_step",
                   "n": "rollout.n", "max_staleness": "rl.max_staleness",
                   "async_rounds": "rl.async_rounds", "buffer_groups": "rl.buffer_groups",
                   "max_new_tokens": "rollout.max_new_tokens"}


def _get(cfg: dict, dotted: str) -> Any:
  for k in dotted.split("."):
    cfg = cfg[k]
  return cfg


def make_profile(config: dict, rows: Sequence[dict], traj: dict[str, list], *,
                 source: str = "") -> dict[str, Any]:
  """The compact, JSON-safe record of a run the planner fits and checks against.

  config: the run's config.json; rows: metrics.jsonl rows; traj: trajectory columns
  step, group_id, domain, outcome, weight_version, prompt_ids or prompt_len, completion_ids
  or completion_len. Raises ValueError naming what is missing."""
  try:
    pipe = {k: _get(config, v) for k, v in PIPELINE_FIELDS.items()}
    members = int(_get(config, "fleet.members")) if _get(config, "rollout.engine") == "fleet" else 1
  except (KeyError, TypeError) as e:
    raise ValueError(f"{source}: config.json lacks field {e}") from e
  by_step = {int(r["step"]): r for r in rows if int(r.get("step", 0)) > 0}
  if not by_step:
    raise ValueError(f"{source}: metrics.jsonl has no step rows")
  for s, r in by_step.items():
    missing = [k for k in REQUIRED if k not in r]
    if missing:
      raise ValueError(f"{source}: metrics.jsonl step {s} lacks {missing}")
  plen = traj.get("prompt_len") or [len(x) for x in traj["prompt_ids"]]
  clen = traj.get("completion_len") or [len(x) for x in traj["completion_ids"]]
  groups: dict[tuple[int, int], list] = {}
  per_step: dict[int, dict] = {}
  for i, (s, gid, dom, out) in enumerate(zip(traj["step"], traj["group_id"], traj["domain"],
                                             traj["outcome"])):
    if out not in ("trained", "filtered", "stale"):
      continue
    g = groups.setdefault((int(s), int(gid)), [dom, int(plen[i]), []])
    g[2].append(int(clen[i]))
    if out == "trained":
      st = per_step.setdefault(int(s), {"longest": 0, "tokens": 0, "trained": 0, "samples": {},
                                        "staleness": {}})
      st["longest"] = max(st["longest"], int(clen[i]))
      st["tokens"] += int(plen[i]) + int(clen[i])
      st["trained"] += 1
      st["samples"][dom] = st["samples"].get(dom, 0) + 1
      k = str(int(s) - 1 - int(traj["weight_version"][i]))
      st["staleness"][k] = st["staleness"].get(k, 0) + 1
  if not groups:
    raise ValueError(f"{source}: the trajectories hold no generated groups")
  keep = ("time/rollout_s", "time/verify_s", "time/train_s", "time/sync_s", "time/step_s",
          "time/wait_s", "time/sync_load_s", "async/engine_busy_s", "async/wall_s")
  steps = []
  for s in sorted(by_step):
    rec = {"step": s, **{k: float(by_step[s][k]) for k in keep if k in by_step[s]}}
    rec.update(per_step.get(s, {"longest": 0, "tokens": 0, "trained": 0, "samples": {},
                                "staleness": {}}))
    steps.append(rec)
  return {"source": source, "pipeline": pipe, "members": members, "steps": steps,
          "groups": [[d, p, ls] for (_, _), (d, p, ls) in sorted(groups.items())]}


def profile_groups(profile: dict) -> list[ps.GroupSample]:
  return [ps.GroupSample(d, int(p), tuple(int(x) for x in ls)) for d, p, ls in profile["groups"]]


def profile_pipeline(profile: dict, **overrides: Any) -> ps.Pipeline:
  """The run's Pipeline, with `overrides` (fields of Pipeline) applied."""
  fields = {k: (str(v) if k == "mode" else int(v)) for k, v in profile["pipeline"].items()}
  fields.update({k: v for k, v in overrides.items() if v is not None})
  return ps.Pipeline(**fields)


def measured(profile: dict, warmup: int) -> dict[str, Any]:
  """The run's own figures over the steps after `warmup`, as launch.bench async
  computes them (trained traj/s, engine busy fraction, wall, staleness fractions)."""
  steps = [r for r in profile["steps"] if r["step"] > warmup]
  if not steps:
    raise ValueError(f"{profile['source']}: no steps after the warm-up of {warmup}")
  wall = sum(r["time/step_s"] for r in steps)
  trained = sum(r["trained"] for r in steps)
  if profile["pipeline"]["mode"] == "async":
    first = next(r for r in profile["steps"] if r["step"] == warmup)
    busy = ((steps[-1]["async/engine_busy_s"] - first["async/engine_busy_s"])
            / max(steps[-1]["async/wall_s"] - first["async/wall_s"], 1e-9))
  else:
    busy = sum(r["time/rollout_s"] for r in steps) / max(wall, 1e-9)
  hist: collections.Counter = collections.Counter()
  for r in steps:
    hist.update({int(k): v for k, v in r["staleness"].items()})
  total = max(sum(hist.values()), 1)
  return {"traj_per_s": trained / max(wall, 1e-9), "engine_busy": busy, "wall_s": wall,
          "step_s": wall / len(steps),
          "train_s": float(np.mean([r["time/train_s"] for r in steps])),
          "trained": trained, "staleness": {k: v / total for k, v in sorted(hist.items())}}


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """Least-squares y = a + b x with a, b >= 0 (b alone through the mean when x barely
  varies)."""
  if len(x) >= 2 and np.ptp(x) > 0.05 * max(np.mean(x), 1e-9):
    b, a = np.polyfit(x, y, 1)
    if a >= 0 and b >= 0:
      return float(a), float(b)
    if b < 0:
      return float(np.mean(y)), 0.0
  return 0.0, float(np.sum(y) / max(np.sum(x), 1e-9))


def fit_costs(profile: dict, warmup: int, *, publish_fraction: float = 0.5,
              host_copy_fraction: float = 0.25, host_slowdown: float = 1.0,
              slowdown_by_kind: dict[str, float] | None = None) -> ps.Costs:
  """The cost model from a sync-mode run's steps after `warmup` (each step one round:
  time/rollout_s is its generation, time/verify_s its verification).

  generation: time/rollout_s = gen_base_s + gen_per_token_s x the step's longest
  sample; verification: verify_base_s + per-domain seconds per sample (non-negative
  least squares over the steps' sample counts); learner: time/train_s = train_base_s +
  train_per_token_s x trained tokens; weight sync: time/sync_s = publish + load, split
  `publish_fraction` : rest, the async host copy `host_copy_fraction` of it; overhead:
  time/step_s minus the four stages (evaluation, checkpoints, trajectory writes)."""
  if profile["pipeline"]["mode"] != "sync":
    raise ValueError(f"{profile['source']}: fit the cost model on a sync-mode run (its steps "
                     "run the stages one after the other); this run is "
                     f"{profile['pipeline']['mode']!r}")
  steps = [r for r in profile["steps"] if r["step"] > warmup and r["trained"] > 0]
  if len(steps) < 2:
    raise ValueError(f"{profile['source']}: need >= 2 steps after the warm-up of {warmup} "
                     f"to fit, found {len(steps)}")
  col = lambda k: np.array([float(r[k]) for r in steps])  # noqa: E731
  gen_a, gen_b = _line(col("longest"), col("time/rollout_s"))
  tr_a, tr_b = _line(col("tokens"), col("time/train_s"))
  domains = sorted({d for r in steps for d in r["samples"]})
  X = np.array([[1.0] + [r["samples"].get(d, 0) for d in domains] for r in steps])
  coef = _nnls(X, col("time/verify_s"))
  sync = float(np.median(col("time/sync_s")))
  stages = col("time/rollout_s") + col("time/verify_s") + col("time/train_s") + col("time/sync_s")
  return ps.Costs(gen_base_s=gen_a, gen_per_token_s=gen_b, verify_base_s=float(coef[0]),
               verify_per_sample_s={d: float(c) for d, c in zip(domains, coef[1:])},
               train_base_s=tr_a, train_per_token_s=tr_b,
               publish_s=publish_fraction * sync, load_s=(1 - publish_fraction) * sync,
               host_copy_s=host_copy_fraction * sync,
               overhead_s=float(np.median(np.maximum(col("time/step_s") - stages, 0.0))),
               host_slowdown=host_slowdown, slowdown_by_kind=dict(slowdown_by_kind or {}))


def _nnls(X: np.ndarray, y: np.ndarray, iters: int = 2000) -> np.ndarray:
  """Non-negative least squares by projected gradient (small problems)."""
  scale = np.maximum(X.max(axis=0), 1e-9)
  A = X / scale
  w = np.maximum(np.linalg.lstsq(A, y, rcond=None)[0], 0.0)
  step = 1.0 / max(np.linalg.norm(A, 2) ** 2, 1e-12)
  for _ in range(iters):
    w = np.maximum(w - step * (A.T @ (A @ w - y)), 0.0)
  return w / scale


MEMBER_KINDS = ("gen", "load")   # work a rollout member does; the rest is the learner side's


def calibrate_host_slowdown(fit: dict, run: dict, warmup: int, *, shape: ps.Shape,
                            replicas: int = 10, rounds: int = 3,
                            **fit_kwargs: Any) -> dict[str, Any]:
  """The shared-host slowdowns at which the simulated `run` (an async run on the same
  host, with its own loop settings and response lengths; `fit`'s costs) reproduces two
  component times that run measured over its steps after `warmup`:

    learner: time/train_s / the solo time `fit`'s (sync run's) learner cost gives for
             the same tokens (median over steps) -> `host_slowdown`, every kind but
             MEMBER_KINDS;
    member:  the engine's busy seconds per trained trajectory (async/engine_busy_s)
             -> `slowdown_by_kind` for MEMBER_KINDS.

  Bisection over [1, 6] for each in turn, `rounds` times (each moves the other's
  overlap). The run's throughput and step times are not targets; they are what a
  prediction with these factors is checked against (calibrate on one run, compare
  with another). Returns {"host_slowdown", "slowdown_by_kind", "measured": {"learner",
  "member_engine_s_per_traj"}, "simulated": the same two figures at the result}."""
  if run["pipeline"]["mode"] != "async":
    raise ValueError(f"{run['source']}: calibrate the shared-host slowdown on an async run "
                     "(a sync run overlaps nothing)")
  costs = fit_costs(fit, warmup, **fit_kwargs)
  ratios = [r["time/train_s"] / (costs.train_base_s + costs.train_per_token_s * r["tokens"])
            for r in run["steps"] if r["step"] > warmup and r["trained"] > 0]
  if not ratios:
    raise ValueError(f"{run['source']}: no trained steps after the warm-up of {warmup}")
  m = measured(run, warmup)
  target = {"learner": float(np.median(ratios)),
            "member": m["engine_busy"] * m["wall_s"] / max(m["trained"], 1)}
  p, groups = profile_pipeline(run), profile_groups(run)   # the run's own workload

  def sim(f_learner: float, f_member: float) -> dict[str, float]:
    c = dataclasses.replace(costs, host_slowdown=f_learner,
                            slowdown_by_kind={k: f_member for k in MEMBER_KINDS})
    r = ps.simulate_many(p, shape, c, groups, steps=6, warmup=warmup, replicas=replicas)
    return {"train_s": r["train_s"]["mean"],
            "member": r["engine_busy"]["mean"] / max(r["traj_per_s"]["mean"], 1e-12)}

  def bisect(figure: Callable[[float], float], want: float, lo: float = 1.0,
             hi: float = 6.0) -> float:
    """The x in [lo, hi] where the increasing `figure(x)` reaches `want` (or an end)."""
    if figure(lo) >= want:
      return lo
    if figure(hi) < want:
      return hi
    for _ in range(12):
      mid = (lo + hi) / 2
      lo, hi = (mid, hi) if figure(mid) < want else (lo, mid)
    return (lo + hi) / 2

  solo_train = sim(1.0, 1.0)["train_s"]
  f = {"learner": 1.0, "member": 1.0}
  for _ in range(rounds):
    f["learner"] = bisect(lambda x: sim(x, f["member"])["train_s"] / solo_train,
                          target["learner"])
    f["member"] = bisect(lambda x: sim(f["learner"], x)["member"], target["member"])
  at_f = sim(f["learner"], f["member"])
  return {"host_slowdown": f["learner"],
          "slowdown_by_kind": {k: f["member"] for k in MEMBER_KINDS},
          "measured": {"learner": target["learner"],
                       "member_engine_s_per_traj": target["member"]},
          "simulated": {"learner": at_f["train_s"] / solo_train,
                        "member_engine_s_per_traj": at_f["member"]}}


TRAJ_COLUMNS = ["step", "group_id", "domain", "outcome", "weight_version", "prompt_ids",
                "completion_ids"]


def load_run(path: str) -> dict[str, Any]:
  """A run's profile (`make_profile`) from its WORKDIR, or a profile JSON file."""
  if os.path.isfile(path) and path.endswith(".json"):
    with open(path) as f:
      return json.load(f)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{path}: neither a run's workdir nor a profile .json")
  need = {"metrics.jsonl": "the per-step metrics", "config.json": "the run's config",
          "trajectories": "the response lengths (trajectories/*.parquet)"}
  for name, what in need.items():
    if not os.path.exists(os.path.join(path, name)):
      raise FileNotFoundError(f"{path}: no {name} ({what}); pass the workdir of a "
                              "launch.train run")
  import pyarrow as pa
  import pyarrow.parquet as pq
  files = sorted(f for f in os.listdir(os.path.join(path, "trajectories"))
                 if f.endswith(".parquet"))
  if not files:
    raise FileNotFoundError(f"{path}/trajectories holds no .parquet files")
  table = pa.concat_tables([pq.read_table(os.path.join(path, "trajectories", f),
                                          columns=TRAJ_COLUMNS) for f in files]).to_pydict()
  rows = []
  with open(os.path.join(path, "metrics.jsonl")) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue  # a torn last line
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  return make_profile(config, rows, table, source=path)


def config_overrides(c: Any) -> dict[str, Any]:
  """Pipeline fields of a training config (`--config`), when one was given."""
  if c is None:
    return {}
  plain = json.loads(c.to_json_best_effort())
  try:
    return {k: _get(plain, v) for k, v in PIPELINE_FIELDS.items() if k != "mode"}
  except (KeyError, TypeError) as e:
    raise ValueError(f"--config is not a training config (no field {e})") from e


def predict(profile: dict, *, shape: Any, overrides: dict[str, Any], steps: int, warmup: int,
            replicas: int, seed: int, host_slowdown: float = 1.0,
            slowdown_by_kind: dict[str, float] | None = None, publish_fraction: float = 0.5,
            host_copy_fraction: float = 0.25) -> dict[str, Any]:
  """Sync and async predictions for `shape` from a sync-mode run's `profile`."""
  costs = fit_costs(profile, warmup, publish_fraction=publish_fraction,
                    host_copy_fraction=host_copy_fraction, host_slowdown=host_slowdown,
                    slowdown_by_kind=slowdown_by_kind)
  groups = profile_groups(profile)
  out: dict[str, Any] = {"fitted_on": profile["source"], "costs": dataclasses.asdict(costs),
                         "shape": dataclasses.asdict(shape)}
  for mode in ("sync", "async"):
    p = profile_pipeline(profile, **{**overrides, "mode": mode})
    if mode == "async" and p.max_staleness < 1:  # a sync run's 0: the bench's default
      p = dataclasses.replace(p, max_staleness=2)
    out[mode] = {"pipeline": dataclasses.asdict(p), **ps.simulate_many(
        p, shape, costs, groups, steps=steps, warmup=warmup, replicas=replicas, seed=seed)}
  return out


def _fmt_range(d: dict[str, float], digits: int = 3) -> str:
  return f"{d['mean']:.{digits}f} [{d['p10']:.{digits}f}, {d['p90']:.{digits}f}]"


def report(pred: dict[str, Any], measured_runs: Sequence[dict[str, Any]]) -> str:
  c = pred["costs"]
  lines = [f"fitted on {pred['fitted_on']} (sync run):",
           f"  generation  {c['gen_base_s']:.2f} s + {1e3 * c['gen_per_token_s']:.1f} ms x longest "
           "sample per batch",
           "  verify      {:.2f} s + per sample {} per round".format(
               c["verify_base_s"], ", ".join(f"{d} {v:.3f} s" for d, v in
                                             c["verify_per_sample_s"].items()) or "-"),
           f"  learner     {c['train_base_s']:.2f} s + {1e3 * c['train_per_token_s']:.2f} ms x "
           f"token, + {c['overhead_s']:.2f} s other per step",
           f"  weight sync publish {c['publish_s']:.2f} s, member load {c['load_s']:.2f} s, async "
           f"host copy {c['host_copy_s']:.2f} s; shared-host slowdown {c['host_slowdown']:.2f}"
           + "".join(f", {k} {v:.2f}" for k, v in sorted(c["slowdown_by_kind"].items())),
           "shape: {members} member(s), learner x{learner_speedup:g}, verifier workers "
           "{verifier_workers}".format(**pred["shape"])]
  if "host_slowdown_from" in pred:
    h = pred["host_slowdown_from"]
    lines.append(f"  host slowdown calibrated on {h['run']}: its learner ran "
                 f"{h['measured']['learner']:.2f}x the fitted solo time (simulated "
                 f"{h['simulated']['learner']:.2f}x), its engine was busy "
                 f"{h['measured']['member_engine_s_per_traj']:.2f} s per trained trajectory "
                 f"(simulated {h['simulated']['member_engine_s_per_traj']:.2f})")
  for mode in ("sync", "async"):
    p = pred[mode]["pipeline"]
    lines.append(f"{mode}: G={p['prompts_per_step']} x n={p['n']}, max_staleness "
                 f"{p['max_staleness']}, {p['async_rounds']} rounds, max_new_tokens "
                 f"{p['max_new_tokens']}")
  head = ["", "sync (predicted)", "async (predicted)"]
  by_mode = {m["mode"]: m for m in measured_runs}
  head += [f"{m} (measured)" for m in ("sync", "async") if m in by_mode]
  rows = []
  for key, name in (("traj_per_s", "trained traj/s"), ("engine_busy", "engine busy"),
                    ("member_busy", "member busy"), ("learner_busy", "learner busy"),
                    ("train_s", "learner update s"), ("step_s", "step s (mean)")):
    digits = 1 if key in ("train_s", "step_s") else 3
    row = [name] + [_fmt_range(pred[m][key], digits) for m in ("sync", "async")]
    for m in [m for m in ("sync", "async") if m in by_mode]:
      v = by_mode[m].get(key)
      row.append("-" if v is None else
                 f"{v:.{digits}f} ({100 * (pred[m][key]['mean'] / max(v, 1e-12) - 1):+.0f} %)")
    rows.append(row)
  fmt_hist = lambda h: " ".join(f"{k}:{v:.2f}" for k, v in h.items()) or "-"  # noqa: E731
  rows.append(["staleness k:fraction", fmt_hist(pred["sync"]["staleness"]),
               fmt_hist(pred["async"]["staleness"])]
              + [fmt_hist(by_mode[m]["staleness"]) for m in ("sync", "async") if m in by_mode])
  lines.append("| " + " | ".join(head) + " |")
  lines.append("|" + " --- |" * len(head))
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  lines.append("predicted: mean [p10, p90] over the simulated runs; measured: (predicted / "
               "measured - 1)")
  return "\n".join(lines)
