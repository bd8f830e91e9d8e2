r"""Draws a run's (or a sweep's) charts and table.

  python -m launch.report --workdir=RUN      # RUN/report/report.md + charts
  python -m launch.report --workdir=SWEEP    # a launch.ablate directory: SWEEP/report.md

The charts and table are those of `launch.ablate`'s report (rlpt.research.report):
training reward, holdout accuracy over steps, response length of correct and
incorrect answers, entropy; holdout, reward, lengths, clip fraction, KL, wall time.
One run's report also lists every domain's holdout change from step 0 to its last
evaluation with the paired 95 % interval (past 8 domains, in place of the holdout
columns; the holdout chart then shows the 8 that moved most).
"""

import os
import sys

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir, or a sweep directory.")


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise SystemExit("--workdir=RUN is required")
  from rlpt.research import report
  from rlpt.train import progress
  wd = _WORKDIR.value
  try:
    if os.path.exists(os.path.join(wd, "sweep.json")):
      path, header, rows = report.write_sweep(wd)
    else:
      path, header, rows = report.write_run(wd)
  except (FileNotFoundError, ValueError) as e:
    sys.stderr.write(f"launch.report: {e}\n")
    sys.exit(2)
  progress.print_summary(f"report of {wd}", header, rows)
  print(f"launch.report: {path}")


if __name__ == "__main__":
  app.run(main)
