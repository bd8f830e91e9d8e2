r"""Plans without the hardware: the per-device memory of one training step, and the
throughput of the RL pipeline on a cluster shape.

  python -m launch.plan --config=configs/long_context_1m.py [--config.a.b=v ...]
  python -m launch.plan async --metrics_from=WORKDIR [--config=CONFIG] [--rollout_members=8]
      [--learner_speedup=8] [--max_staleness=2] [--steps=6] [--json=FILE] ...

`async`: a discrete-event simulation of the pipeline (rlpt.train.pipeline_sim), sync
and async, fed with a sync-mode run's own metrics.jsonl, trajectories/ and config.json
(WORKDIR, or a profile JSON that `--save_profile` wrote from one): the empirical
response-length groups, and costs fitted from its per-step stage times. It prints
trained trajectories/s, engine, member and learner busy fractions and the staleness
histogram (mean and p10-p90 over `--replicas` simulated runs), and beside them the
measured figures of `--metrics_from` and of each `--compare_with` run. `--config`
(a training config) and the flags override the run's loop settings. On one shared
machine, `--host_slowdown_from=ASYNC_RUN` calibrates how much overlapped work slows
down on the learner's measured update times of that run (see `calibrate_host_slowdown`).

Memory plan (no subcommand):

Builds the step (decoder forward with ring attention over the mesh's "seq" axis,
chunked next-token loss, gradients, optax AdamW update, parameters and optimizer
state donated) from `ShapeDtypeStruct`s only, lowers and compiles it for a
simulated mesh of host CPU devices (nothing is allocated), and prints the compiled
executable's per-device memory by category and whether it fits `hbm_budget_gib`.
Exit status 0 when it fits, 1 when it does not.

The numbers come from XLA's CPU compiler (buffer assignment of the per-device SPMD
program); a GPU/TPU compiler fuses differently, so treat them as a plan, not a
measurement of device HBM.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence

from absl import flags
from ml_collections import config_flags
import numpy as np

from launch import config_cli
from rlpt.train import pipeline_sim as ps

_CONFIG = config_flags.DEFINE_config_file("config", None, "Plan config file.",
                                          lock_config=True)
GIB = 2 ** 30
MESH_AXES = ("data", "fsdp", "tensor", "seq")

# `python -m launch.plan async` (see the module docstring); None = the run's own value.
_METRICS_FROM = flags.DEFINE_string("metrics_from", None, "async: a sync-mode run's WORKDIR "
                                    "(metrics.jsonl, trajectories/, config.json) or profile JSON.")
_COMPARE_WITH = flags.DEFINE_list("compare_with", [], "async: runs whose measured figures are "
                                  "shown beside the prediction for their mode.")
_MEMBERS = flags.DEFINE_integer("rollout_members", None, "async: rollout members.")
_SPEEDUP = flags.DEFINE_float("learner_speedup", 1.0, "async: learner speed / the measured one.")
_VERIFIERS = flags.DEFINE_integer("verifier_workers", None, "async: rounds verified at once "
                                  "(default: one per producer).")
_STALENESS = flags.DEFINE_integer("max_staleness", None, "async: rl.max_staleness (default: "
                                  "the run's, 2 when the run's is 0).")
_PROMPTS = flags.DEFINE_integer("prompts_per_step", None, "async: data.prompts_per_step.")
_ROUNDS = flags.DEFINE_integer("async_rounds", None, "async: rl.async_rounds.")
_STEPS = flags.DEFINE_integer("steps", 6, "async: measured steps per simulated run.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "async: steps before the measured ones (also the "
                               "runs' warm-up, left out of fitting and measuring).")
_REPLICAS = flags.DEFINE_integer("replicas", 20, "async: simulated runs per figure.")
_SEED = flags.DEFINE_integer("seed", 0, "async: seed of the first simulated run.")
_SLOWDOWN = flags.DEFINE_float("host_slowdown", 1.0, "async: slowdown of overlapped work on a "
                               "shared host (1 = separate devices).")
_SLOWDOWN_FROM = flags.DEFINE_string("host_slowdown_from", None, "async: measure host_slowdown "
                                     "as the learner's slowdown in this (async) run.")
_PUBLISH_FRACTION = flags.DEFINE_float("publish_fraction", 0.5, "async: publish share of the "
                                       "sync run's time/sync_s (the rest: the member's load).")
_HOST_COPY_FRACTION = flags.DEFINE_float("host_copy_fraction", 0.25, "async: the async host "
                                         "copy as a share of the sync run's time/sync_s.")
_JSON = flags.DEFINE_string("json", None, "async: write the prediction here.")
_SAVE_PROFILE = flags.DEFINE_string("save_profile", None, "async: write --metrics_from's "
                                    "profile JSON here (a small, reusable record of the run).")


def _use_host_devices(n: int) -> None:
  """Gives XLA n host devices; must run before jax is imported."""
  if "jax" in sys.modules:
    raise RuntimeError("launch.plan: jax was imported before the device count was set")
  flags_ = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
  os.environ["XLA_FLAGS"] = " ".join(flags_ + [f"--xla_force_host_platform_device_count={n}"])
  os.environ["JAX_PLATFORMS"] = "cpu"


def chunked_nll(cfg, params, tokens, mask, chunk: int, seq_shards: int):
  """Mean next-token NLL over real tokens without materializing [B, T, V] logits.

  `rlpt.models.logprobs.chunked_logprobs` with strided chunks: T/chunk projections of
  `chunk` positions (projection j holds positions j, j + T/chunk, ...), so with T sharded over
  `seq_shards` devices every device projects its own positions per step and nothing is
  gathered. Each chunk is rematerialised in the backward pass.
  """
  import jax.numpy as jnp
  from rlpt.models import decoder
  from rlpt.models.logprobs import chunked_logprobs

  B, T = tokens.shape
  if T % chunk or chunk % seq_shards:
    raise ValueError(f"loss_chunk={chunk} must divide seq_len={T} and be a multiple of the "
                     f"seq axis size {seq_shards}")
  h = decoder.forward(cfg, params, tokens, attention_mask=mask, return_hidden=True)
  targets = jnp.roll(tokens, -1, axis=1)
  weight = (mask & jnp.roll(mask, -1, axis=1)).at[:, -1].set(False).astype(jnp.float32)
  lp, _ = chunked_logprobs(cfg, params, h, targets, chunk_size=chunk, strided=True,
                           remat=True)
  return -jnp.sum(lp * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def build_plan(c):
  """Lowers and compiles the step; returns (compiled, info dict)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.sharding import NamedSharding, PartitionSpec as P
  from rlpt.models import decoder
  from rlpt.models.sharding import logical_sharding, make_mesh, param_shardings

  cfg = decoder.ModelConfig(**c.model.to_dict())
  shape = tuple(c.mesh[a] for a in MESH_AXES)
  mesh = make_mesh(*shape)

  params, p_shard = {"layers": {}}, {"layers": {}}
  shardings = param_shardings(cfg, mesh)
  for path, (shp, _, _) in decoder.param_specs(cfg).items():
    sh = shardings[path]
    head, _, leaf = path.rpartition(".")
    (params[head] if head else params)[leaf] = jax.ShapeDtypeStruct(shp, jnp.float32, sharding=sh)
    (p_shard[head] if head else p_shard)[leaf] = sh
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))

  tx = optax.adamw(c.lr, weight_decay=c.weight_decay)
  opt_struct = jax.eval_shape(tx.init, params)
  replicated = NamedSharding(mesh, P())
  o_shard = optax.tree_map_params(tx, lambda _, s: s, opt_struct, p_shard,
                                  transform_non_params=lambda _: replicated)
  opt_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                           opt_struct, o_shard)
  tok_sh = logical_sharding(("batch", "length"), (c.batch, c.seq_len), mesh)
  tokens = jax.ShapeDtypeStruct((c.batch, c.seq_len), jnp.int32, sharding=tok_sh)
  mask = jax.ShapeDtypeStruct((c.batch, c.seq_len), jnp.bool_, sharding=tok_sh)

  def train_step(params, opt_state, tokens, mask):
    loss, grads = jax.value_and_grad(chunked_nll, argnums=1)(
        cfg, params, tokens, mask, c.loss_chunk, c.mesh.seq)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(train_step, in_shardings=(p_shard, o_shard, tok_sh, tok_sh),
                 out_shardings=(p_shard, o_shard, replicated), donate_argnums=(0, 1))
  t0 = time.perf_counter()
  with jax.set_mesh(mesh):
    lowered = step.lower(params, opt_state, tokens, mask)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  return compiled, dict(params=n_params, mesh=dict(zip(MESH_AXES, shape)),
                        devices=int(np.prod(shape)), lower_s=t1 - t0, compile_s=t2 - t1,
                        tokens_per_device=int(np.prod(tok_sh.shard_shape(tokens.shape))))


def memory_report(compiled, info, budget_gib: float) -> tuple[str, bool, dict]:
  m = compiled.memory_analysis()
  cats = dict(arguments=m.argument_size_in_bytes, outputs=m.output_size_in_bytes,
              aliased=m.alias_size_in_bytes, temporaries=m.temp_size_in_bytes,
              generated_code=m.generated_code_size_in_bytes)
  peak = (cats["arguments"] + cats["outputs"] - cats["aliased"] + cats["temporaries"]
          + cats["generated_code"])
  fits = peak <= budget_gib * GIB
  lines = [f"mesh {info['mesh']} = {info['devices']} devices; {info['params'] / 1e9:.3f} B "
           f"parameters; {info['tokens_per_device']} tokens per device",
           f"lower {info['lower_s']:.1f} s, compile {info['compile_s']:.1f} s",
           "per-device memory:"]
  for k, v in cats.items():
    lines.append(f"  {k:<15} {v / GIB:9.3f} GiB")
  lines.append(f"  {'peak':<15} {peak / GIB:9.3f} GiB  (arguments + outputs - aliased + "
               f"temporaries + generated_code)")
  lines.append(f"budget {budget_gib:g} GiB: {'FITS' if fits else 'DOES NOT FIT'} "
               f"({peak / GIB / budget_gib:.1%} of budget)")
  return "\n".join(lines), fits, dict(cats, peak=peak)


def main(argv):
  if argv[1:] == ["async"]:
    try:
      plan_async()
    except (ValueError, FileNotFoundError) as e:
      raise SystemExit(f"launch.plan async: {e}")
    return
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]} (subcommands: async)")
  c = _CONFIG.value
  if c is None:
    raise SystemExit("--config=configs/NAME.py is required")
  n = 1
  for a in MESH_AXES:
    n *= c.mesh[a]
  _use_host_devices(n)
  t0 = time.perf_counter()
  compiled, info = build_plan(c)
  text, fits, _ = memory_report(compiled, info, c.hbm_budget_gib)
  print(f"plan {flags.FLAGS['config'].config_filename}: batch {c.batch} x seq_len "
        f"{c.seq_len} tokens, model {c.model.num_layers} layers x {c.model.hidden_size}, "
        f"dtype {c.model.dtype}, remat {c.model.remat}")
  print(text)
  print(f"total {time.perf_counter() - t0:.1f} s")
  sys.exit(0 if fits else 1)


# ----------------------------------------------------------------------------- launch.plan async

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
              host_copy_fraction: float = 0.25, host_slowdown: float = 1.0) -> ps.Costs:
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
               host_slowdown=host_slowdown)


def _nnls(X: np.ndarray, y: np.ndarray, iters: int = 2000) -> np.ndarray:
  """Non-negative least squares by projected gradient (small problems)."""
  scale = np.maximum(X.max(axis=0), 1e-9)
  A = X / scale
  w = np.maximum(np.linalg.lstsq(A, y, rcond=None)[0], 0.0)
  step = 1.0 / max(np.linalg.norm(A, 2) ** 2, 1e-12)
  for _ in range(iters):
    w = np.maximum(w - step * (A.T @ (A @ w - y)), 0.0)
  return w / scale


def calibrate_host_slowdown(fit: dict, run: dict, warmup: int, *, shape: ps.Shape,
                            replicas: int = 10, **fit_kwargs: Any) -> tuple[float, float]:
  """(host_slowdown, measured learner slowdown): the shared-host slowdown at which the
  simulated `run` (an async run on the same host; its own loop settings) slows the
  learner as much as `run` measured: median over its steps after `warmup` of
  time/train_s / the time `fit`'s sync-run learner cost predicts for those tokens.
  Bisection over [1, 4]; the throughput of `run` is not used."""
  costs = fit_costs(fit, warmup, **fit_kwargs)
  ratios = [r["time/train_s"] / (costs.train_base_s + costs.train_per_token_s * r["tokens"])
            for r in run["steps"] if r["step"] > warmup and r["trained"] > 0]
  if not ratios:
    raise ValueError(f"{run['source']}: no trained steps after the warm-up of {warmup}")
  target = float(np.median(ratios))
  p, groups = profile_pipeline(run), profile_groups(fit)

  def sim_ratio(f: float) -> float:
    t = [ps.simulate_many(p, shape, dataclasses.replace(costs, host_slowdown=x), groups,
                          steps=6, warmup=warmup, replicas=replicas)["train_s"]["mean"]
         for x in (f, 1.0)]
    return t[0] / t[1]
  lo, hi = 1.0, 4.0
  if sim_ratio(hi) < target:
    return hi, target
  for _ in range(12):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if sim_ratio(mid) < target else (lo, mid)
  return (lo + hi) / 2, target


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


def _config_overrides(c: Any) -> dict[str, Any]:
  """Pipeline fields of a training config (`--config`), when one was given."""
  if c is None:
    return {}
  plain = json.loads(c.to_json_best_effort())
  try:
    return {k: _get(plain, v) for k, v in PIPELINE_FIELDS.items() if k != "mode"}
  except (KeyError, TypeError) as e:
    raise ValueError(f"--config is not a training config (no field {e})") from e


def predict(profile: dict, *, shape: Any, overrides: dict[str, Any], steps: int, warmup: int,
            replicas: int, seed: int, host_slowdown: float = 1.0, publish_fraction: float = 0.5,
            host_copy_fraction: float = 0.25) -> dict[str, Any]:
  """Sync and async predictions for `shape` from a sync-mode run's `profile`."""
  costs = fit_costs(profile, warmup, publish_fraction=publish_fraction,
                    host_copy_fraction=host_copy_fraction, host_slowdown=host_slowdown)
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
           f"host copy {c['host_copy_s']:.2f} s; shared-host slowdown {c['host_slowdown']:.2f}",
           "shape: {members} member(s), learner x{learner_speedup:g}, verifier workers "
           "{verifier_workers}".format(**pred["shape"])]
  if "host_slowdown_from" in pred:
    h = pred["host_slowdown_from"]
    lines.append(f"  host slowdown calibrated on {h['run']}: its learner ran "
                 f"{h['learner_slowdown_measured']:.2f}x the fitted solo time")
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


def plan_async() -> dict[str, Any]:
  if not _METRICS_FROM.value:
    raise ValueError("--metrics_from=WORKDIR (a sync-mode launch.train run) is required")
  warmup = _WARMUP.value
  profile = load_run(_METRICS_FROM.value)
  if _SAVE_PROFILE.value:
    with open(_SAVE_PROFILE.value, "w") as f:
      json.dump(profile, f)
  overrides = _config_overrides(_CONFIG.value)
  overrides.update({k: v for k, v in (("max_staleness", _STALENESS.value),
                                      ("prompts_per_step", _PROMPTS.value),
                                      ("async_rounds", _ROUNDS.value)) if v is not None})
  shape = ps.Shape(members=_MEMBERS.value or int(profile["members"]),
                   learner_speedup=_SPEEDUP.value, verifier_workers=_VERIFIERS.value)
  fractions = dict(publish_fraction=_PUBLISH_FRACTION.value,
                   host_copy_fraction=_HOST_COPY_FRACTION.value)
  slowdown, learner_measured = _SLOWDOWN.value, None
  if _SLOWDOWN_FROM.value:
    run = load_run(_SLOWDOWN_FROM.value)
    slowdown, learner_measured = calibrate_host_slowdown(
        profile, run, warmup, shape=ps.Shape(members=int(run["members"])), **fractions)
  pred = predict(profile, shape=shape, overrides=overrides, steps=_STEPS.value, warmup=warmup,
                 replicas=_REPLICAS.value, seed=_SEED.value, host_slowdown=slowdown,
                 **fractions)
  if learner_measured is not None:
    pred["host_slowdown_from"] = {"run": _SLOWDOWN_FROM.value,
                                  "learner_slowdown_measured": learner_measured}
  runs = [profile] + [load_run(p) for p in _COMPARE_WITH.value]
  pred["measured"] = [{"source": r["source"], "mode": r["pipeline"]["mode"],
                       **measured(r, warmup)} for r in runs]
  print(report(pred, pred["measured"]))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(pred, f, indent=1)
  return pred


if __name__ == "__main__":
  config_cli.run(main)
