r"""Per-device memory plan of one training step, compiled ahead of time.

  python -m launch.plan --config=configs/long_context_1m.py [--config.a.b=v ...]

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

import os
import sys
import time

from absl import flags
from ml_collections import config_flags

from launch import config_cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Plan config file.",
                                          lock_config=True)
GIB = 2 ** 30
MESH_AXES = ("data", "fsdp", "tensor", "seq")


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
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
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


if __name__ == "__main__":
  config_cli.run(main)
