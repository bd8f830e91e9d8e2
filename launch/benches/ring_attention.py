r"""Ring attention on 8 fake CPU devices: memory scaling, causal balance, time.

  python -m launch.bench ring_attention [--json=FILE] [--heads=8] [--kv_heads=2]
      [--head_dim=64] [--block=128] [--time_len=4096]

Rows (training step = forward + backward of sum(w * attention)):
- `temp/dev T=.. N=8`: per-device temporary bytes of the compiled ring step
  (`memory_analysis().temp_size_in_bytes`) as T grows; baseline = single-device
  blockwise attention at the same T. Note: MiB per 1k local tokens (flat = T/N).
- `temp/dev T=.. N=..`: fixed T, devices doubled; baseline = the same at N/2
  (ratio 2.0 = halved).
- `causal max/mean N=..`: attention FLOPs per device over the whole ring, counted
  tile by tile with the kernel's own skip rule (a [block, block] tile is computed iff
  its causal mask has any True); rlpt = zigzag, baseline = contiguous (≈ 2N/(N+1)).
- `time ...`: wall seconds of the jitted step (indicative only: 8 fake devices share
  the machine's cores).
XLA_FLAGS must give 8 host devices before jax starts; this module sets it on import.
"""

from __future__ import annotations

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402

from launch.benches import common  # noqa: E402

BASELINE_NAME = "baseline"
MIB = 2 ** 20


def _step(attn):
  """jit of (q, k, v, w) -> (sum(w * attn(q, k, v)), its gradients in q, k, v)."""
  import jax
  import jax.numpy as jnp

  def f(q, k, v, w):
    return jax.value_and_grad(lambda q, k, v: jnp.sum(w * attn(q, k, v)),
                              argnums=(0, 1, 2))(q, k, v)
  return jax.jit(f)


def _inputs(mesh, T, a, sharded=True):
  """ShapeDtypeStructs (for compiling only) or arrays, sequence-sharded on `mesh`."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  sh = NamedSharding(mesh, P(None, "seq")) if sharded else None
  shapes = [(1, T, a.heads, a.head_dim), (1, T, a.kv_heads, a.head_dim),
            (1, T, a.kv_heads, a.head_dim), (1, T, a.heads, a.head_dim)]
  return [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sh) for s in shapes]


def _arrays(structs):
  import jax
  out = []
  for i, s in enumerate(structs):
    x = jax.random.normal(jax.random.key(i), s.shape, s.dtype)
    out.append(jax.device_put(x, s.sharding) if s.sharding is not None else x)
  return out


def _mesh(n):
  import jax
  from jax.sharding import Mesh
  return Mesh(np.array(jax.devices()[:n]), ("seq",))


def ring_temp_bytes(T, n, a, layout="natural"):
  from rlpt.ops import attention as A
  mesh = _mesh(n)
  step = _step(lambda q, k, v: A.ring_attention(q, k, v, mesh=mesh, layout=layout,
                                                block_size=a.block))
  return step.lower(*_inputs(mesh, T, a)).compile().memory_analysis().temp_size_in_bytes


def blockwise_temp_bytes(T, a):
  from rlpt.ops import attention as A
  step = _step(lambda q, k, v: A.blockwise_attention(q, k, v, block_q=a.block,
                                                     block_k=a.block))
  return step.lower(*_inputs(None, T, a, sharded=False)).compile().memory_analysis().temp_size_in_bytes


def causal_flops_per_device(T, n, layout, block, heads, head_dim):
  """FLOPs each device spends on attention tiles over the n ring steps (forward:
  QK^T and PV, 4 * bq * bk * D per head), counting only tiles the kernel computes."""
  from rlpt.ops import attention as A
  pos = A.layout_positions(T, n, layout)                # [n, T/n]
  tl = T // n
  blk = min(block, tl // 2 if layout == "zigzag" else tl)
  qmax = pos.reshape(n, tl // blk, blk).max(-1)        # [n, nq]
  kmin = pos.reshape(n, tl // blk, blk).min(-1)        # [n, nk]
  flops = np.zeros(n)
  for d in range(n):
    for s in range(n):
      src = (d - s) % n                                # whose K/V device d holds at step s
      tiles = (kmin[src][None, :] <= qmax[d][:, None]).sum()
      flops[d] += tiles * 4 * blk * blk * head_dim * heads
  return flops


def _time(step, structs, iters):
  args = _arrays(structs)
  return statistics.median(common.time_fn(
      lambda: [x.block_until_ready() for x in __import__("jax").tree.leaves(step(*args))],
      warmup=1, iters=iters))


def run(argv: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="bench ring_attention")
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--block", type=int, default=128)
  p.add_argument("--time_len", type=int, default=4096)
  p.add_argument("--iters", type=int, default=3)
  a = p.parse_args(argv)
  import jax
  if jax.device_count() < 8:
    raise SystemExit(f"bench ring_attention needs 8 devices, jax sees {jax.device_count()}: "
                     f"start it with XLA_FLAGS={_FLAG} (jax was imported before this bench set it)")
  from rlpt.ops import attention as A
  rows = []

  # 1. memory as T grows at N=8, against one device holding the whole sequence.
  n = 8
  for T in (8192, 16384, 32768, 65536):
    ring = ring_temp_bytes(T, n, a)
    single = blockwise_temp_bytes(T, a)
    rows.append(common.Row(f"temp/dev T={T} N={n}", ring / MIB, single / MIB, "MiB",
                           higher_is_better=False,
                           note=f"{ring / MIB / (T / n / 1024):.3f} MiB per 1k local tokens; "
                                f"baseline: blockwise, 1 device"))

  # 2. fixed T, devices doubled.
  T = 32768
  temps = {m: ring_temp_bytes(T, m, a) for m in (2, 4, 8)}
  for m in (4, 8):
    rows.append(common.Row(f"temp/dev T={T} N={m}", temps[m] / MIB, temps[m // 2] / MIB, "MiB",
                           higher_is_better=False,
                           note=f"baseline: N={m // 2}; halved = 2.00x "
                                f"(off by {abs(temps[m // 2] / temps[m] / 2 - 1):.1%})"))

  # 3. causal balance.
  for m in (4, 8):
    zig = causal_flops_per_device(T, m, "zigzag", a.block, a.heads, a.head_dim)
    con = causal_flops_per_device(T, m, "contiguous", a.block, a.heads, a.head_dim)
    rows.append(common.Row(f"causal max/mean N={m}", zig.max() / zig.mean(),
                           con.max() / con.mean(), "ratio", higher_is_better=False,
                           note=f"zigzag vs contiguous; contiguous: (2N-1)/N = {(2 * m - 1) / m:.3f} "
                                f"with tile-level skipping on the diagonal, 2N/(N+1) = "
                                f"{2 * m / (m + 1):.3f} if it were computed whole"))

  # 4. time (indicative on CPU).
  tl = a.time_len // n
  mesh = _mesh(n)
  structs = _inputs(mesh, a.time_len, a)
  ring_step = _step(lambda q, k, v: A.ring_attention(q, k, v, mesh=mesh, block_size=a.block))
  t_ring = _time(ring_step, structs, a.iters)
  for T1, label in ((tl, "equal per-device block"), (a.time_len, "same total T")):
    blk_step = _step(lambda q, k, v: A.blockwise_attention(q, k, v, block_q=a.block,
                                                           block_k=a.block))
    t1 = _time(blk_step, _inputs(None, T1, a, sharded=False), a.iters)
    rows.append(common.Row(f"time ring N={n} T={a.time_len} vs 1 dev T={T1}", t_ring, t1, "s",
                           higher_is_better=False,
                           note=f"{label}; fwd+bwd; 8 fake devices share the CPU cores"))
  con_step = _step(lambda q, k, v: A.ring_attention(q, k, v, mesh=mesh, block_size=a.block,
                                                    layout="contiguous"))
  rows.append(common.Row(f"time ring N={n} T={a.time_len} zigzag vs contiguous", t_ring,
                         _time(con_step, structs, a.iters), "s", higher_is_better=False,
                         note="same ring; contiguous = no load balancing"))
  return rows
