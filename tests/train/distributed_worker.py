"""One process of tests/train/test_distributed.py: a Learner on a (data=2, fsdp=2) mesh
of 4 devices, in 1 process (4 devices) or 2 processes (2 devices each).

  python tests/train/distributed_worker.py MODE PROCESS_ID NUM_PROCESSES PORT OUT [CKPT]

MODE: "steps" (3 learner steps; process 0 writes OUT.json with the metrics and OUT.npz
with the gathered parameters), "save" (the 3 steps, then an Orbax checkpoint of the
learner state into CKPT, written by every process), "restore" (a fresh learner restores
CKPT; process 0 writes OUT.npz), "loop" (steps until killed; writes OUT.ready first),
"config" (the mesh check, then process i passes the config {"seed": i}).
"""

import json
import os
import sys

MODE, PID, NPROC, PORT, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
    sys.argv[5]
CKPT = sys.argv[6] if len(sys.argv) > 6 else None
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={4 // NPROC}"
sys.path.insert(0, os.environ["RLPT_ROOT"])

from rlpt.train import distributed  # noqa: E402

if NPROC > 1:
  distributed.initialize(f"127.0.0.1:{PORT}", NPROC, PID, timeout_s=60, heartbeat_s=5)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rlpt.algorithms import AlgoSpec  # noqa: E402
from rlpt.models import Decoder, ModelConfig  # noqa: E402
from rlpt.models.sharding import make_mesh  # noqa: E402
from rlpt.train import checkpoint  # noqa: E402
from rlpt.train.learner import Learner, metrics_to_host  # noqa: E402
from rlpt.train.optim import OptimConfig  # noqa: E402

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)
B, T = 8, 12


def learner(seed=0):
  return Learner(Decoder(CFG, rngs=nnx.Rngs(seed)), AlgoSpec(loss_agg="seq_mean_token_sum"),
                 OptimConfig(lr=1e-3), microbatch_size=4, mesh=make_mesh(data=2, fsdp=2))


def step(lrn, i):
  rng = np.random.default_rng(i)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  attn = np.ones((B, T), bool)
  attn[1, :3] = False
  lm = np.zeros((B, T), bool)
  lm[:, 5:] = True
  lm &= attn
  lp = lrn.logprobs(tokens, attn, lm)
  batch = lrn.prepare(tokens, attn, lm, lp, rng.normal(size=B).astype(np.float32),
                      group_size=2, pad_multiple=1)
  return metrics_to_host(lrn.step(batch))


def params_of(lrn):
  flat = jax.tree_util.tree_flatten_with_path(lrn.state.params)[0]
  return {"/".join(str(p) for p in k): distributed.host_value(v) for k, v in flat}


def main():
  if MODE == "config":   # process i passes config {"seed": i}: process 1 differs
    distributed.check_mesh({"data": 2, "fsdp": 2})
    try:
      distributed.check_mesh({"data": 2})
    except distributed.DistributedError as e:
      print("mesh error:", e, flush=True)
    distributed.check_same_config({"seed": PID})
    return
  lrn = learner()
  out = {"processes": jax.process_count(), "devices": jax.device_count()}
  if MODE in ("steps", "save"):
    out["metrics"] = [step(lrn, i) for i in range(3)]
    if MODE == "save":
      with checkpoint.Checkpointer(CKPT, keep=1) as ck:
        ck.save(3, {"params": lrn.state.params, "opt_state": lrn.state.opt_state})
  elif MODE == "restore":
    with checkpoint.Checkpointer(CKPT, keep=1) as ck:
      info = ck.restore({"params": lrn.state.params, "opt_state": lrn.state.opt_state})
    lrn.state = lrn.state._replace(params=info.state["params"],
                                   opt_state=info.state["opt_state"])
    out["step"] = info.step
    out["next"] = step(lrn, 3)     # the restored state trains on
  elif MODE == "loop":
    step(lrn, 0)
    open(OUT + ".ready", "w").close()
    i = 1
    while True:
      step(lrn, i)
      i += 1
  if distributed.is_primary():
    np.savez(OUT + ".npz", **params_of(lrn))
    with open(OUT + ".json", "w") as f:
      json.dump(out, f)


if __name__ == "__main__":
  main()
