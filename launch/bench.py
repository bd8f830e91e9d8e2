r"""Benchmarks rlpt beside a peer, in one process tree, and prints their ratio.

  python -m launch.bench NAME [--json=FILE] [benchmark flags]

NAME is one of the modules in launch/benches/ (rollout, train_step, weight_sync,
sandbox, rewards, ring_attention, async, serve, ...). The table shows rlpt, the baseline and
their ratio (> 1 means rlpt is better); --json writes
{"rows": [{"name", "rlpt", "baseline", "ratio", ...}]}.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from launch import benches
from launch.benches import common


def available() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(benches.__path__)
                if m.name != "common" and not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  names = available()
  parser = argparse.ArgumentParser(prog="python -m launch.bench", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("name", help=f"one of: {', '.join(names) or '(none built yet)'}")
  parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
  args, rest = parser.parse_known_args(argv)
  if args.name not in names:
    parser.error(f"unknown benchmark '{args.name}'; available: {', '.join(names) or 'none yet'}")
  module = importlib.import_module(f"launch.benches.{args.name}")
  rows = module.run(rest)
  print(common.format_rows(f"bench {args.name}", rows,
                           getattr(module, "BASELINE_NAME", "baseline")), flush=True)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    common.write_json(args.json, rows, benchmark=args.name)
  return 0


if __name__ == "__main__":
  sys.exit(main())
