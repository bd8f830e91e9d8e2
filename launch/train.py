r"""Runs an RL experiment.

  python -m launch.train --config=configs/NAME.py[:ARG] [--config.a.b=v ...] [--workdir=DIR]

The resolved config is written to WORKDIR/config.json; running again on the same
workdir resumes from its last checkpoint.
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
    "allow_config_change", False, "Resume a workdir whose config.json differs.")

def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise SystemExit("--config=configs/NAME.py is required")
  from rlpt.train import workdir as workdir_lib
  workdir = _WORKDIR.value or workdir_lib.default_workdir(flags.FLAGS["config"].config_filename)
  from rlpt.train import settings
  try:  # semantic config checks, before anything is written or loaded
    settings.Settings.from_config(_CONFIG.value)
  except settings.ConfigError as e:
    sys.stderr.write(f"launch.train: config error: {e}\n")
    sys.exit(2)
  try:
    wd = workdir_lib.prepare_workdir(workdir, _CONFIG.value,
                                     allow_config_change=_ALLOW_CONFIG_CHANGE.value)
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
