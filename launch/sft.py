r"""Runs the supervised warm-up (SFT) of an experiment on its own.

  python -m launch.sft --config=configs/NAME.py[:ARG] [--config.sft.steps=N ...] [--workdir=DIR]

Trains the configured policy on demonstrations of the configured domains (the
reference answers in the format the RL stage rewards), saves the weights under
WORKDIR/sft, and prints holdout accuracy per domain before and after. A later
`launch.train` on the same workdir starts RL from these weights.
"""

import sys

from absl import flags, logging
from ml_collections import config_flags

from launch import config_cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Run directory (default: runs/<config name>).")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False, "Reuse a workdir whose config.json differs.")


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise SystemExit("--config=configs/NAME.py is required")
  from rlpt.train import build, evaluation, progress, sft
  from rlpt.train import workdir as workdir_lib
  from rlpt.train.settings import ConfigError, Settings
  config = _CONFIG.value
  try:
    settings = Settings.from_config(config)
  except ConfigError as e:
    sys.stderr.write(f"launch.sft: config error: {e}\n")
    sys.exit(2)
  cfg = settings.sft
  if cfg.steps < 1:
    sys.stderr.write("launch.sft: config error: config.sft.steps = 0: expected >= 1 "
                     "(pass --config.sft.steps=N)\n")
    sys.exit(2)
  workdir = _WORKDIR.value or workdir_lib.default_workdir(
      flags.FLAGS["config"].config_filename)
  try:
    wd = workdir_lib.prepare_workdir(workdir, config,
                                     allow_config_change=_ALLOW_CONFIG_CHANGE.value)
  except workdir_lib.WorkdirConfigMismatch as e:
    sys.stderr.write(f"launch.sft: {e}\n")
    sys.exit(2)
  if logging.get_verbosity() == logging.INFO:
    logging.set_verbosity(logging.WARNING)
  parts = build.build(settings, wd)
  ev = lambda: evaluation.evaluate(parts.engine, parts.holdout,
                                   max_new_tokens=settings.rollout.max_new_tokens,
                                   reward_config=settings.rewards, seed=settings.seed,
                                   episodes=settings.episodes)
  before = ev() if parts.holdout else {}
  bar = progress.ProgressBar(total=cfg.steps, desc="sft")
  try:
    res = sft.run_sft(parts.model, parts.tokenizer, parts.sources, cfg, f"{wd.root}/sft",
                      pad_id=parts.pad_id, log=lambda s, loss: bar.update(s, loss=loss),
                      mesh=parts.mesh)
    bar.close()
    build.weight_sync(parts, wd).sync(parts.model, version=0)
    after = ev() if parts.holdout else {}
  finally:
    close = getattr(parts.engine, "shutdown", None)
    if close is not None:
      close()
  print(f"SFT: {res['steps']} steps, loss {res['losses'][0]:.3f} -> {res['losses'][-1]:.3f}"
        + (" (restored)" if res["restored"] else f" in {res['seconds']:.0f} s"))
  rows = [[d, f"{100 * before[d]['accuracy']:.1f}", f"{100 * after[d]['accuracy']:.1f}"]
          for d in sorted(after)]
  if rows:
    progress.print_summary("holdout accuracy (%) per domain", ["domain", "base", "after SFT"],
                           rows)


if __name__ == "__main__":
  config_cli.run(main)
