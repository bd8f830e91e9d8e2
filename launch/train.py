r"""Runs an RL experiment.

  python -m launch.train --config=configs/NAME.py[:ARG] [--config.a.b=v ...] [--workdir=DIR]
  python -m launch.train --config=... --seeds=0,1,2 [--workdir=DIR]

The resolved config is written to WORKDIR/config.json; running again on the same
workdir resumes from its last checkpoint. With --seeds, each seed runs as its own
`launch.train` process with --config.seed=N in DIR/seed_N (one after another; a seed
already finished resumes at its end and only reprints), and the run ends with the
several-seed table of holdout gains (rlpt.train.seed_summary), also in DIR/seeds.json.

Several processes (one per host of a TPU pod or GPU node; or several CPU processes on
one machine), every one started with the same command and its own --process_id:

  python -m launch.train --config=... --workdir=DIR --coordinator_address=HOST:PORT \
      --num_processes=N --process_id=I

(or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, and what JAX detects
itself under SLURM and on Cloud TPU). `jax.distributed` joins them before anything
touches a device; config.mesh spans every process's devices (its axes' product must be
the job's device count); each process generates and verifies its share of every
round's groups with its own embedded engine (rlpt.train.process_rounds); the learner
steps on the global mesh; checkpoints are written by all processes together (Orbax);
metrics, trajectories and evals.json by process 0. The workdir must be on a file
system every process sees.
"""

import json
import os
import subprocess
import sys

from absl import flags, logging
from ml_collections import config_flags

from launch import config_cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Run directory (default: runs/<config name>).")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False, "Resume a workdir whose config.json differs.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "HOST:PORT of process 0's coordinator (multi-process runs; "
    "default: JAX_COORDINATOR_ADDRESS).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Processes in the job (default: JAX_NUM_PROCESSES; 1).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index in [0, num_processes) (default: JAX_PROCESS_ID).")
_SEEDS = flags.DEFINE_list(
    "seeds", None, "Run these seeds (comma-separated), each in WORKDIR/seed_N, then "
    "print the several-seed table.")


def _child_argv(argv: list[str]) -> list[str]:
  """This command's flags without --seeds and --workdir (either '--f=v' or '--f v')."""
  out, skip = [], False
  for a in argv[1:]:
    if skip:
      skip = False
      continue
    name = a.split("=", 1)[0]
    if name in ("--seeds", "--workdir"):
      skip = "=" not in a
      continue
    out.append(a)
  return out


def run_seeds(seeds: list[int], workdir: str) -> int:
  """Runs each seed in its own process and workdir; prints and writes the table.
  Returns the exit status: 0 when every seed finished."""
  from rlpt.train import progress, seed_summary
  failed, done = [], []
  for seed in seeds:
    wd = os.path.join(workdir, f"seed_{seed}")
    cmd = [sys.executable, "-m", "launch.train", *_child_argv(sys.argv),
           f"--config.seed={seed}", f"--workdir={wd}"]
    print(f"launch.train: seed {seed} -> {wd}", flush=True)
    rc = subprocess.call(cmd)
    (done if rc == 0 else failed).append((seed, wd, rc))
  if done:
    header, rows, report = seed_summary.summarize([w for _, w, _ in done],
                                                  [f"seed {s}" for s, _, _ in done])
    progress.print_summary(f"holdout gain over {len(done)} seeds (%, paired 95 % intervals)",
                           header, rows)
    with open(os.path.join(workdir, "seeds.json"), "w") as f:
      json.dump({"seeds": [s for s, _, _ in done], "domains": report}, f, indent=1)
  for seed, wd, rc in failed:
    sys.stderr.write(f"launch.train: seed {seed} failed (exit {rc}); its log is above, "
                     f"its workdir {wd} resumes on the next call\n")
  return 1 if failed else 0


def _use_cpu_devices(n: int) -> None:
  """config.cpu_devices: n host devices from XLA's CPU platform (fake devices for a mesh
  on one machine); must run before JAX creates its CPU client. 0 = leave XLA_FLAGS."""
  if n <= 0:
    return
  flag = "--xla_force_host_platform_device_count"
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(flag)]
  os.environ["XLA_FLAGS"] = " ".join(kept + [f"{flag}={n}"])


def check_multiprocess(config) -> None:
  """DistributedError naming the field when `config` cannot run on this job's processes:
  the mesh must cover every process's devices, every process must have the same config,
  and the loop is the synchronous one over embedded engines."""
  from rlpt.train import distributed
  distributed.check_mesh(dict(config.mesh))
  distributed.check_same_config(config)
  if config.rl.mode != "sync":
    raise distributed.DistributedError(
        f"rl.mode={config.rl.mode!r}: a multi-process run trains in rl.mode='sync' (each "
        "process generates its share of a step's groups)")
  if config.rollout.engine != "jax":
    raise distributed.DistributedError(
        f"rollout.engine={config.rollout.engine!r}: a multi-process run generates with "
        "each process's embedded engine (rollout.engine='jax')")


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise SystemExit("--config=configs/NAME.py is required")
  from rlpt.train import workdir as workdir_lib
  workdir = _WORKDIR.value or workdir_lib.default_workdir(flags.FLAGS["config"].config_filename)
  _use_cpu_devices(int(_CONFIG.value.get("cpu_devices", 0) or 0))
  from rlpt.train import distributed
  try:   # joins the job's processes before anything touches a device (the config checks do)
    multi = distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  except distributed.DistributedError as e:
    sys.stderr.write(f"launch.train: {e}\n")
    sys.exit(2)
  from rlpt.train import settings
  try:  # semantic config checks, before anything is written or loaded
    settings.Settings.from_config(_CONFIG.value)
  except settings.ConfigError as e:
    sys.stderr.write(f"launch.train: config error: {e}\n")
    sys.exit(2)
  try:
    if multi:
      check_multiprocess(_CONFIG.value)
  except distributed.DistributedError as e:
    sys.stderr.write(f"launch.train: {e}\n")
    sys.exit(2)
  if _SEEDS.value:
    if multi:
      sys.stderr.write("launch.train: --seeds runs seeds one after another in one process; "
                       "start each seed's multi-process job on its own\n")
      sys.exit(2)
    try:
      seeds = [int(x) for x in _SEEDS.value]
    except ValueError:
      sys.stderr.write(f"launch.train: --seeds wants integers, got {_SEEDS.value}\n")
      sys.exit(2)
    sys.exit(run_seeds(seeds, workdir))
  try:
    if not distributed.is_primary():   # process 0 writes config.json first
      distributed.barrier("workdir")
    wd = workdir_lib.prepare_workdir(workdir, _CONFIG.value,
                                     allow_config_change=_ALLOW_CONFIG_CHANGE.value)
    if multi and distributed.is_primary():
      distributed.barrier("workdir")
  except workdir_lib.WorkdirConfigMismatch as e:
    sys.stderr.write(f"launch.train: {e}\n")
    sys.exit(2)
  logging.info("workdir %s (config written to %s)", wd.root, wd.config_json)
  from rlpt.train import rl_loop
  # Orbax reports every checkpoint step at INFO; keep the run's own output readable.
  if logging.get_verbosity() == logging.INFO:
    logging.set_verbosity(logging.WARNING)
  rl_loop.train(_CONFIG.value, wd)


if __name__ == "__main__":
  config_cli.run(main)
