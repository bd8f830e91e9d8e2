r"""Runs a sweep: every arm x seed of a sweep file, then its report.

  python -m launch.ablate --sweep=configs/sweeps/NAME.py[:ARG] [--seeds=0,1,2]
                          [--workdir=DIR] [--parallel=N]

Each arm x seed trains in its own process and workdir, DIR/ARM/seed_N (log.txt
beside it), through the same path as `launch.train`, so a killed sweep picks up where
it stopped: a finished run (result.json) is not rerun, an interrupted one resumes from
its last checkpoint, and one that failed (failed.json, with its error) is tried again.
Runs go one after another, or as Ray tasks, N at a time, with --parallel=N (when the
machine has the cores). Every arm's config is built and checked before the first run
starts: an arm that overrides an unknown field, or with a value of the wrong type, is
refused, naming the arm and the field. The sweep ends with DIR/report.md and its
charts (rlpt.research.report); exit status 1 when a run failed (the report still
covers the others).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import flags

from launch import config_cli, sweep as sweep_lib

_SWEEP = flags.DEFINE_string("sweep", None, "Sweep file: configs/sweeps/NAME.py[:ARG].")
_SEEDS = flags.DEFINE_list("seeds", None, "Seeds to run (default: the sweep file's).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory (default runs/sweeps/NAME).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once (> 1: as Ray tasks).")
# One run, in a child process (what the sweep starts for each arm x seed).
_ARM = flags.DEFINE_string("arm", None, "Run only this arm (with --seed), in this process.")
_SEED = flags.DEFINE_integer("seed", None, "The seed of --arm's run.")


def run_dir(root: str, arm: str, seed: int) -> str:
  return os.path.join(root, arm, f"seed_{seed}")


def _write_json(path: str, obj) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(path + ".tmp", path)


def _earlier_wall_s(run: str) -> float:
  """Wall seconds of the run's earlier attempts that ended in a failure (attempts.json)."""
  path = os.path.join(run, "attempts.json")
  if not os.path.exists(path):
    return 0.0
  with open(path) as f:
    return float(json.load(f).get("wall_s", 0.0))


def _run_one(sweep: sweep_lib.Sweep, root: str, arm_name: str, seed: int) -> None:
  """Trains one arm x seed in this process (resuming its workdir); writes result.json."""
  from absl import logging
  from rlpt.research import runs
  from rlpt.train import rl_loop, workdir as workdir_lib
  cfg = sweep_lib.arm_config(sweep, sweep.arm(arm_name), seed)
  wd_path = run_dir(root, arm_name, seed)
  t0 = time.monotonic()
  wd = workdir_lib.prepare_workdir(wd_path, cfg)
  if logging.get_verbosity() == logging.INFO:
    logging.set_verbosity(logging.WARNING)
  result = rl_loop.train(cfg, wd)
  previous = _earlier_wall_s(wd_path)
  _write_json(os.path.join(wd_path, runs.RESULT),
              {"arm": arm_name, "seed": seed, "steps": result.step,
               "wall_s": previous + time.monotonic() - t0})


def _error_of(log_path: str) -> str:
  """The last line of a failed run's log that names an error (else its last line)."""
  try:
    with open(log_path, errors="replace") as f:
      lines = [ln.strip() for ln in f.read().splitlines()[-200:] if ln.strip()]
  except OSError:
    return "no log"
  for ln in reversed(lines):
    if "Error" in ln or "error:" in ln or "Exception" in ln:
      return ln[-300:]
  return lines[-1][-300:] if lines else "no output"


def _child_cmd(sweep: sweep_lib.Sweep, root: str, arm: str, seed: int) -> list[str]:
  return [sys.executable, "-m", "launch.ablate", f"--sweep={sweep.path}", f"--workdir={root}",
          f"--arm={arm}", f"--seed={seed}"]


def _spawn(cmd: list[str], log_path: str) -> int:
  with open(log_path, "a") as log:
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)}\n")
    log.flush()
    return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)


def _settle(sweep, root, arm, seed, rc, seconds) -> str:
  """Records a child's outcome (failed.json or none); returns the line to print."""
  from rlpt.research import runs
  d = run_dir(root, arm, seed)
  failed = os.path.join(d, runs.FAILED)
  if rc == 0 and os.path.exists(os.path.join(d, runs.RESULT)):
    if os.path.exists(failed):
      os.remove(failed)
    return f"done in {seconds / 60:.1f} min"
  err = _error_of(os.path.join(d, "log.txt"))
  _write_json(failed, {"arm": arm, "seed": seed, "exit": rc, "error": err})
  # The time it ran still counts towards the run's wall time when it resumes.
  _write_json(os.path.join(d, "attempts.json"), {"wall_s": _earlier_wall_s(d) + seconds})
  return f"FAILED (exit {rc}): {err}"


def run_sweep(sweep: sweep_lib.Sweep, seeds: list[int], root: str, parallel: int = 1) -> int:
  """Runs every unfinished arm x seed, then writes the report. Returns the exit status."""
  from rlpt.research import runs
  os.makedirs(root, exist_ok=True)
  _write_json(os.path.join(root, "sweep.json"), dict(sweep.to_json(), seeds=seeds))
  todo = []
  for arm in sweep.arms:
    for seed in seeds:
      d = run_dir(root, arm.name, seed)
      if os.path.exists(os.path.join(d, runs.RESULT)):
        print(f"launch.ablate: {arm.name} seed {seed}: finished before, not rerun", flush=True)
        continue
      os.makedirs(d, exist_ok=True)
      todo.append((arm.name, seed))
  n = len(todo)
  if parallel > 1 and n > 1:
    import ray

    @ray.remote(num_cpus=1)
    def remote(cmd, log_path):
      t0 = time.monotonic()
      return _spawn(cmd, log_path), time.monotonic() - t0

    ray.init(num_cpus=parallel, include_dashboard=False, log_to_driver=False)
    try:
      refs = {remote.remote(_child_cmd(sweep, root, a, s),
                            os.path.join(run_dir(root, a, s), "log.txt")): (a, s)
              for a, s in todo}
      print(f"launch.ablate: {n} runs as Ray tasks, {parallel} at a time", flush=True)
      pending = list(refs)
      while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        a, s = refs[ready[0]]
        rc, secs = ray.get(ready[0])
        print(f"launch.ablate: {a} seed {s}: {_settle(sweep, root, a, s, rc, secs)}", flush=True)
    finally:
      ray.shutdown()
  else:
    for i, (a, s) in enumerate(todo, 1):
      log_path = os.path.join(run_dir(root, a, s), "log.txt")
      print(f"launch.ablate: [{i}/{n}] {a} seed {s} (log: {log_path})", flush=True)
      t0 = time.monotonic()
      rc = _spawn(_child_cmd(sweep, root, a, s), log_path)
      print(f"launch.ablate: {a} seed {s}: "
            f"{_settle(sweep, root, a, s, rc, time.monotonic() - t0)}", flush=True)
  from rlpt.research import report
  path, header, rows = report.write_sweep(root)
  from rlpt.train import progress
  progress.print_summary(f"sweep {sweep.name} ({len(sweep.arms)} arms x {len(seeds)} seeds)",
                         header, rows)
  print(f"launch.ablate: report: {path}", flush=True)
  failed = [r for r in rows if r[-1].startswith("failed")]
  return 1 if failed else 0


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if not _SWEEP.value:
    raise SystemExit("--sweep=configs/sweeps/NAME.py is required")
  try:
    sweep = sweep_lib.load(_SWEEP.value)
    seeds = [int(x) for x in _SEEDS.value] if _SEEDS.value else list(sweep.seeds)
    root = _WORKDIR.value or os.path.join("runs", "sweeps", sweep.name)
    if _ARM.value is None:
      sweep_lib.check(sweep, seeds)
    elif _SEED.value is None:
      raise sweep_lib.SweepError("--arm needs --seed")
  except (sweep_lib.SweepError, ValueError) as e:
    sys.stderr.write(f"launch.ablate: {e}\n")
    sys.exit(2)
  if _ARM.value is not None:   # a child: one run; a crash prints its traceback to log.txt
    _run_one(sweep, root, _ARM.value, _SEED.value)
    return
  sys.exit(run_sweep(sweep, seeds, root, max(1, _PARALLEL.value)))


if __name__ == "__main__":
  config_cli.run(main)
