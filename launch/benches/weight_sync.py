r"""Weight sync: publishing policy version N+1 and loading it on every fleet member.

  python -m launch.bench weight_sync [--json=FILE] [--members=2] [--iters=3]
                                     [--model=smollm2-135m-instruct]

rlpt: `WeightPublisher.publish` writes the SmolLM2 params as an Orbax checkpoint
(WORKDIR/weights/vN+1), then `Fleet.update_weights` has each of `members` rollout
server processes (rlpt.rollout.server_main, what launch.serve runs; Ray actors on
127.0.0.1) restore it into its JaxEngine and acknowledge the version over SGLang's
/update_weights_from_disk.

Baseline (a raw file copy of the same bytes): every parameter written as one flat
file with `ndarray.tofile` (the publish), then read back whole by `members`
concurrent readers (the loads). Both sides go through the same page cache.
Ratio = baseline seconds / rlpt seconds (> 1: rlpt is faster than a raw copy).

Also reported: the in-process swap (`JaxEngine.update_weights` of a params
pytree, and of the Orbax path) with no baseline. Figures are medians over `iters`
versions after a first one (v1, timed and reported on its own row: each member's
first restore opens Orbax/tensorstore and compiles its decode layout), since a run
syncs once a step, every step.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import tempfile
import time

from launch.benches import common

BASELINE_NAME = "raw_file_copy"


def _raw_write(arrays, path: str) -> float:
  t0 = time.perf_counter()
  with open(path, "wb") as f:
    for a in arrays:
      a.tofile(f)
    f.flush()
    os.fsync(f.fileno())
  return time.perf_counter() - t0


def _raw_read(path: str, readers: int) -> float:
  import numpy as np

  def read():
    return np.fromfile(path, dtype=np.uint8).nbytes

  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(readers) as ex:
    list(ex.map(lambda _: read(), range(readers)))
  return time.perf_counter() - t0


def _perturb(params, step: int):
  import jax
  return jax.tree.map(lambda x: x * (1.0 + 1e-3 * step), params)


def run(args: list[str]) -> list[common.Row]:
  p = argparse.ArgumentParser(prog="python -m launch.bench weight_sync")
  p.add_argument("--members", type=int, default=2)
  p.add_argument("--iters", type=int, default=5)
  p.add_argument("--model", default="smollm2-135m-instruct")
  p.add_argument("--workdir", default=None, help="where versions are written (default: a temp dir)")
  a = p.parse_args(args)

  import jax
  import numpy as np

  from rlpt.models import load_model
  from rlpt.rollout.fleet import Fleet, ServerSpec
  from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig
  from rlpt.rollout.server_main import ServeSettings
  from rlpt.train.publish import WeightPublisher

  work = a.workdir or tempfile.mkdtemp(prefix="rlpt-weight-sync-")
  model, tokenizer = load_model(a.model)
  params = model.arrays()
  nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(params))
  publisher = WeightPublisher(os.path.join(work, "weights"), keep=1)
  spec = ServerSpec(ServeSettings(model=a.model, warmup=False,
                                  engine=JaxEngineConfig(max_batch=8, max_len=2048,
                                                         kv_cache_mib=256)),
                    env=(("JAX_PLATFORMS", "cpu"), ("XLA_FLAGS", "")), log_dir=work)
  fleet = Fleet([spec] * a.members, health_interval_s=0)
  pub_s, load_s, raw_w, raw_r, swap_p, swap_o = [], [], [], [], [], []
  engine = JaxEngine(model, tokenizer, JaxEngineConfig(max_batch=8, kv_cache_mib=256))
  first = None
  try:
    for step in range(1, a.iters + 2):
      new = jax.block_until_ready(_perturb(params, step))
      t0 = time.perf_counter()
      info = publisher.publish(new, step)
      t1 = time.perf_counter()
      fleet.update_weights(info.path, step)
      t2 = time.perf_counter()
      assert fleet.weight_versions() == [step] * a.members
      if step == 1:
        first = t2 - t0
        publisher.gc(in_use=[step])
        continue
      pub_s.append(t1 - t0)
      load_s.append(t2 - t1)
      host = [np.asarray(x) for x in jax.tree.leaves(new)]
      raw = os.path.join(work, "raw.bin")
      raw_w.append(_raw_write(host, raw))
      raw_r.append(_raw_read(raw, a.members))
      os.remove(raw)
      swap_p.append(engine.update_weights(new, 100 + step).seconds)
      swap_o.append(engine.update_weights(info.path, 200 + step).seconds)
      publisher.gc(in_use=[step])
  finally:
    fleet.shutdown()
    if a.workdir is None:
      shutil.rmtree(work, ignore_errors=True)

  med = statistics.median
  gb = nbytes / 1e9
  total, raw_total = med(pub_s) + med(load_s), med(raw_w) + med(raw_r)
  note = f"{gb:.2f} GB of float32 params, {a.members} members, median of {a.iters} after v1"
  return [
      common.Row(f"publish + load v(N+1) on {a.members} members", total, raw_total, "s",
                 higher_is_better=False, note=note),
      common.Row("publish (Orbax save) vs raw write", med(pub_s), med(raw_w), "s",
                 higher_is_better=False),
      common.Row(f"load + ack on {a.members} members vs {a.members} raw reads", med(load_s),
                 med(raw_r), "s", higher_is_better=False),
      common.Row("sync throughput", gb / total, gb / raw_total, "GB/s"),
      common.Row(f"first sync (v1) on {a.members} members", first, None, "s",
                 higher_is_better=False, note="not in the medians"),
      common.Row("in-process swap from params", med(swap_p), None, "s", higher_is_better=False,
                 note="JaxEngine.update_weights(pytree)"),
      common.Row("in-process swap from Orbax", med(swap_o), None, "s", higher_is_better=False,
                 note="JaxEngine.update_weights(path)"),
  ]
