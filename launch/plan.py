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
down: the learner side on that run's measured update times, the rollout members on its
engine busy seconds per trained trajectory (see
rlpt.train.pipeline_profile, which holds the profile, the fit and the report).

Memory plan (no subcommand):

Builds the learner's own step (rlpt.train.learner.train_step on a packed Batch of
`batch` sequences of `seq_len` tokens with `window` scored tokens per row: decoder
forward with ring attention over the mesh's "seq" axis, each layer's output pinned
to the rules table's activation sharding, chunked policy-loss logprobs, gradients,
the learner's optax update, state donated) from `ShapeDtypeStruct`s only, lowers and
compiles it for a simulated mesh of host CPU devices (nothing is allocated) with the
projections an accelerator runs (`projections.accelerator_dots`: not the CPU-only
blocked contractions kept for HF parity), and prints the compiled executable's
per-device memory by category and whether it fits `hbm_budget_gib` (`--json=FILE`
writes them). With `decode` in the config (batch, cache_len) it also compiles the
embedded engine's decode step (one token for `batch` rows over a float32 KV cache of
`cache_len` slots, projection weights in the compute dtype) on the same mesh and
prints its memory against the budget left after the engine's float32 parameters, and
with `hbm_tbps` the step time and tokens/s that reading its weights and cache at that
bandwidth allows. Exit status 0 when everything fits, 1 when not.

The numbers come from XLA's CPU compiler (buffer assignment of the per-device SPMD
program); a GPU/TPU compiler fuses differently, so treat them as a plan, not a
measurement of device HBM.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from absl import flags
from ml_collections import config_flags
import numpy as np

from launch import config_cli
from rlpt.train import pipeline_profile as pp
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
_MEMBER_SLOWDOWN = flags.DEFINE_float("member_slowdown", None, "async: the slowdown of a "
                                      "member's batches and loads on a shared host (default: "
                                      "--host_slowdown).")
_SLOWDOWN_FROM = flags.DEFINE_string("host_slowdown_from", None, "async: calibrate "
                                     "--host_slowdown on this (async) run's learner update "
                                     "times and --member_slowdown on its engine busy seconds "
                                     "(pipeline_profile.calibrate_host_slowdown).")
_PUBLISH_FRACTION = flags.DEFINE_float("publish_fraction", 0.5, "async: publish share of the "
                                       "sync run's time/sync_s (the rest: the member's load).")
_HOST_COPY_FRACTION = flags.DEFINE_float("host_copy_fraction", 0.25, "async: the async host "
                                         "copy as a share of the sync run's time/sync_s.")
_JSON = flags.DEFINE_string("json", None, "Write the plan here (async: the prediction; memory "
                            "plan: per-device GiB by category and the peak).")
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


def build_plan(c):
  """Lowers and compiles the learner's step (rlpt.train.learner.train_step: the packed
  batch, the policy loss, gradients, the optax update, state donated) for `c`'s mesh
  from `ShapeDtypeStruct`s; returns (compiled, info dict)."""
  import functools

  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P
  from rlpt.algorithms.spec import AlgoSpec
  from rlpt.models import decoder, projections
  from rlpt.models.sharding import logical_sharding, make_mesh, state_shardings
  from rlpt.train import learner as learner_lib
  from rlpt.train.optim import OptimConfig, make_optimizer

  cfg = decoder.ModelConfig(**c.model.to_dict())
  shape = tuple(c.mesh[a] for a in MESH_AXES)
  mesh = make_mesh(*shape)
  S, T = int(c.batch), int(c.seq_len)
  rows = S * int(c.get("rows_per_sequence", 1))
  window = int(c.get("window", T))
  if T % (2 * c.mesh.seq):
    raise ValueError(f"seq_len={T} must be a multiple of 2 x mesh.seq = {2 * c.mesh.seq}")

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: decoder.Decoder(cfg, rngs=nnx.Rngs(0))))
  is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
  p_shard = jax.tree.map(lambda v, sh: v.replace(sh), abstract,
                         state_shardings(abstract, mesh), is_leaf=is_var)
  params = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                        abstract, p_shard)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  tx = make_optimizer(OptimConfig(lr=float(c.lr), weight_decay=float(c.weight_decay)))
  replicated = NamedSharding(mesh, P())
  opt_struct = jax.eval_shape(tx.init, (params, None))
  # Adam's moments sharded like their parameters; counters replicated
  o_shard = optax.tree_map_params(tx, lambda _, sh: sh, opt_struct, (p_shard, None),
                                  transform_non_params=lambda _: replicated)
  opt_state = jax.tree.map(lambda s_, sh: jax.ShapeDtypeStruct(s_.shape, s_.dtype, sharding=sh),
                           opt_struct, o_shard)
  state = learner_lib.TrainState(params, opt_state, jax.ShapeDtypeStruct((), jnp.int32,
                                                                         sharding=replicated))
  state_sh = jax.tree.map(lambda x: x.sharding, state)

  seq_sh = logical_sharding(("batch", "length"), (S, T), mesh)  # the sequence over the ring
  row_sh = logical_sharding(("batch", None), (rows, window), mesh)
  dtypes = dict(tokens=jnp.int32, positions=jnp.int32, segments=jnp.int32, src=jnp.int32,
                targets=jnp.int32, loss_mask=jnp.bool_)
  fields = {}
  for f in learner_lib.Batch._fields:
    seq_field = f in learner_lib.SEQ_FIELDS
    fields[f] = jax.ShapeDtypeStruct((S, T) if seq_field else (rows, window),
                                     dtypes.get(f, jnp.float32),
                                     sharding=seq_sh if seq_field else row_sh)
  batch = learner_lib.Batch(**fields)
  batch_sh = learner_lib.Batch(**{f: x.sharding for f, x in fields.items()})

  n_micro = int(c.get("microbatches", 1))
  if S % n_micro:
    raise ValueError(f"batch={S} sequences do not split into microbatches={n_micro}")
  fn = functools.partial(learner_lib.train_step, graphdef, tx, AlgoSpec(), n_micro,
                         int(c.loss_chunk))
  step = jax.jit(fn, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, replicated),
                 donate_argnums=(0,))
  t0 = time.perf_counter()
  # the accelerator's program: not the CPU-only blocked contractions kept for HF parity
  with jax.set_mesh(mesh), projections.accelerator_dots():
    lowered = step.lower(state, batch)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  return compiled, dict(params=n_params, mesh=dict(zip(MESH_AXES, shape)),
                        devices=int(np.prod(shape)), lower_s=t1 - t0, compile_s=t2 - t1,
                        tokens_per_device=int(np.prod(seq_sh.shard_shape((S, T)))),
                        window=window, rows=rows, microbatches=n_micro,
                        train_flops=train_flops(cfg, S, T))


def build_decode_plan(c):
  """Lowers and compiles one decode step of the embedded engine (rlpt.models.decoder.forward
  with a KV cache: `c.decode.batch` rows of one new token over `c.decode.cache_len`
  slots, the cache donated) on `c`'s mesh, with the weights the engine's decode loop
  reads (projections in the compute dtype, rlpt.rollout.jax_engine; norms and the
  embedding float32) placed as the learner's, and its float32 KV cache sharded by
  rlpt.models.sharding.cache_shardings. Returns (compiled, info dict); info["resident"]
  adds the bytes per device the engine also holds outside the step (its float32
  parameters, which prefill reads)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from rlpt.models import decoder, projections
  from rlpt.models.sharding import cache_shardings, logical_sharding, make_mesh, \
      state_shardings

  cfg = decoder.ModelConfig(**c.model.to_dict())
  d = c.decode
  shape = tuple(c.mesh[a] for a in MESH_AXES)
  mesh = make_mesh(*shape)
  B, S = int(d.batch), int(d.cache_len)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: decoder.Decoder(cfg, rngs=nnx.Rngs(0))))
  shardings = state_shardings(abstract, mesh)
  dt = cfg.compute_dtype

  def leaf(path, a, sh):
    name = str(getattr(path[-1], "key", ""))
    low = name in projections.PROJECTIONS or name == "lm_head"
    return jax.ShapeDtypeStruct(a.shape, dt if low else a.dtype, sharding=sh)
  is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
  state = jax.tree_util.tree_map_with_path(
      lambda p, v, sh: v.replace(leaf(p, v.get_value(), sh)), abstract, shardings,
      is_leaf=is_var)
  f32_bytes = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(abstract))
  cache_sh = cache_shardings(cfg, B, S, mesh)
  cache = jax.tree.map(lambda sh, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                       cache_sh, jax.eval_shape(lambda: decoder.init_cache(cfg, B, S)))
  tok_sh = logical_sharding(("batch", None), (B, 1), mesh)
  tokens = jax.ShapeDtypeStruct((B, 1), jnp.int32, sharding=tok_sh)

  def step(state, tokens, cache):
    params = nnx.merge(graphdef, state).arrays()
    logits, cache = decoder.forward(cfg, params, tokens, cache=cache)
    return logits[:, -1], cache

  fn = jax.jit(step, out_shardings=(logical_sharding(("batch", "vocab"), (B, cfg.vocab_size),
                                                     mesh), cache_sh), donate_argnums=(2,))
  t0 = time.perf_counter()
  with jax.set_mesh(mesh), projections.accelerator_dots():
    lowered = fn.lower(state, tokens, cache)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  weights = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
                for x in jax.tree.leaves(state))
  kv = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(cache))
  devices = int(np.prod(shape))
  return compiled, dict(mesh=dict(zip(MESH_AXES, shape)), devices=devices, batch=B,
                        cache_len=S, lower_s=t1 - t0, compile_s=time.perf_counter() - t1,
                        params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract)),
                        tokens_per_device=B * S // devices,
                        weight_bytes=weights, cache_bytes=kv,
                        resident=f32_bytes / devices)


def train_flops(cfg, sequences: int, T: int) -> float:
  """Model FLOPs of one learner step (forward + backward, rematerialisation not
  counted, as MFU counts them): 6 x the matmul parameters (LM head included) per
  token, plus causal attention's 6 x L x H x Dh x T per token (QK^T and PV, half
  the [T, T] pairs, times 3 for the backward)."""
  d, f, h, k, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  matmul = cfg.num_layers * (2 * d * h * dh + 2 * d * k * dh + 3 * d * f) + d * cfg.vocab_size
  per_token = 6.0 * matmul + 6.0 * cfg.num_layers * h * dh * T
  return per_token * sequences * T


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
  text, fits, cats = memory_report(compiled, info, c.hbm_budget_gib)
  print(f"plan {flags.FLAGS['config'].config_filename}: batch {c.batch} x seq_len "
        f"{c.seq_len} tokens, model {c.model.num_layers} layers x {c.model.hidden_size}, "
        f"dtype {c.model.dtype}, remat {c.model.remat}")
  print(text)
  flops = info["train_flops"]
  line = f"model FLOPs per step {flops:.3e} ({flops / info['devices']:.3e} per device)"
  if c.get("peak_tflops"):
    mfu = float(c.get("mfu", 0.4))
    step_s = flops / (info["devices"] * c.peak_tflops * 1e12 * mfu)
    info.update(step_s=step_s, mfu=mfu, peak_tflops=float(c.peak_tflops))
    line += (f"; at {mfu:.0%} MFU of {c.peak_tflops:g} TFLOP/s per device: {step_s:.2f} s "
             f"a step, {c.batch * c.seq_len / step_s:,.0f} tokens/s")
  print(line)
  if c.get("decode"):
    dec, dinfo = build_decode_plan(c)
    dtext, dfits, dcats = memory_report(dec, dinfo, c.hbm_budget_gib - dinfo["resident"] / GIB)
    per_dev = (dinfo["weight_bytes"] + dinfo["cache_bytes"]) / dinfo["devices"]
    print(f"engine decode step: {dinfo['batch']} rows x {dinfo['cache_len']} cache slots, "
          f"weights {dinfo['weight_bytes'] / GIB:.2f} GiB (projections in "
          f"{c.model.dtype}), float32 KV cache {dinfo['cache_bytes'] / GIB:.2f} GiB; the "
          f"engine's float32 parameters (prefill) add {dinfo['resident'] / GIB:.2f} GiB per "
          f"device, taken off the budget below")
    print(dtext.split("\n", 1)[1])
    dinfo.update(gib={k: v / GIB for k, v in dcats.items()}, fits=bool(dfits))
    if c.get("hbm_tbps"):
      t = per_dev / (float(c.hbm_tbps) * 1e12)
      dinfo["step_s_at_bandwidth"] = t
      print(f"a decode step reads {per_dev / GIB:.2f} GiB per device: >= {t * 1e3:.1f} ms at "
            f"{c.hbm_tbps:g} TB/s, <= {dinfo['batch'] / t:,.0f} tokens/s")
    info["decode"] = dinfo
    fits = fits and dfits
  print(f"total {time.perf_counter() - t0:.1f} s")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(dict(info, gib={k: v / GIB for k, v in cats.items()},
                     budget_gib=float(c.hbm_budget_gib), fits=bool(fits)), f, indent=1)
  sys.exit(0 if fits else 1)


def plan_async() -> dict[str, Any]:
  if not _METRICS_FROM.value:
    raise ValueError("--metrics_from=WORKDIR (a sync-mode launch.train run) is required")
  warmup = _WARMUP.value
  profile = pp.load_run(_METRICS_FROM.value)
  if _SAVE_PROFILE.value:
    with open(_SAVE_PROFILE.value, "w") as f:
      json.dump(profile, f)
  overrides = pp.config_overrides(_CONFIG.value)
  overrides.update({k: v for k, v in (("max_staleness", _STALENESS.value),
                                      ("prompts_per_step", _PROMPTS.value),
                                      ("async_rounds", _ROUNDS.value)) if v is not None})
  shape = ps.Shape(members=_MEMBERS.value or int(profile["members"]),
                   learner_speedup=_SPEEDUP.value, verifier_workers=_VERIFIERS.value)
  fractions = dict(publish_fraction=_PUBLISH_FRACTION.value,
                   host_copy_fraction=_HOST_COPY_FRACTION.value)
  slowdown = _SLOWDOWN.value
  by_kind = ({k: _MEMBER_SLOWDOWN.value for k in pp.MEMBER_KINDS}
             if _MEMBER_SLOWDOWN.value is not None else {})
  calibration = None
  if _SLOWDOWN_FROM.value:
    run = pp.load_run(_SLOWDOWN_FROM.value)
    calibration = pp.calibrate_host_slowdown(
        profile, run, warmup, shape=ps.Shape(members=int(run["members"])), **fractions)
    slowdown, by_kind = calibration["host_slowdown"], calibration["slowdown_by_kind"]
  pred = pp.predict(profile, shape=shape, overrides=overrides, steps=_STEPS.value, warmup=warmup,
                    replicas=_REPLICAS.value, seed=_SEED.value, host_slowdown=slowdown,
                    slowdown_by_kind=by_kind, **fractions)
  if calibration is not None:
    pred["host_slowdown_from"] = {"run": _SLOWDOWN_FROM.value, **calibration}
  runs = [profile] + [pp.load_run(p) for p in _COMPARE_WITH.value]
  pred["measured"] = [{"source": r["source"], "mode": r["pipeline"]["mode"],
                       **pp.measured(r, warmup)} for r in runs]
  print(pp.report(pred, pred["measured"]))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(pred, f, indent=1)
  return pred


if __name__ == "__main__":
  config_cli.run(main)
