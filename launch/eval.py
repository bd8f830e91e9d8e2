r"""Evaluates a checkpoint of a run, or a model file, on a config's holdout.

  python -m launch.eval --config=configs/default.py --checkpoint=runs/default[/STEP|/sft]
  python -m launch.eval --config=configs/default.py --model=path/to/model.gguf
                        [--n=8] [--k=1,4] [--domains=math,rg/chain_sum] [--name=NAME] [--out=DIR]
  python -m launch.eval --config=configs/agentic_python_tool.py --checkpoint=runs/agentic/sft \
                        --config.episodes.with_tools=False --n=0 --name=sft_no_tool

Per domain: greedy accuracy with its 95 % interval (the training loop's own
evaluation, so a run's final checkpoint reproduces its final holdout table), pass@k
from --n samples per task at the config's temperature (unbiased estimator; --n=0:
greedy only), mean
score, response length, samples cut at the budget, violation counts and unscored
samples (a verifier that failed). A table on stdout, OUT/NAME.json and OUT/NAME.png
(OUT defaults to WORKDIR/evals for a checkpoint, evals/ for a model; NAME to the step
or the model's file name). Bad input (no such checkpoint, a checkpoint of another
model, k > n, an unknown domain) ends with one line saying which, exit status 2.
"""

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from launch import config_cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "WORKDIR, WORKDIR/STEP or WORKDIR/sft.")
_MODEL = flags.DEFINE_string("model", None, "A model path (HF dir, .gguf) or name.")
_N = flags.DEFINE_integer("n", 8, "Samples per task for pass@k (0: greedy accuracy only).")
_K = flags.DEFINE_list("k", ["1", "4"], "pass@k for these k (each <= n).")
_DOMAINS = flags.DEFINE_list("domains", None, "Only these holdout domains.")
_NAME = flags.DEFINE_string("name", None, "Output name (default: step_N / the model's name).")
_OUT = flags.DEFINE_string("out", None, "Output directory.")


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise SystemExit("--config=configs/NAME.py is required")
  from rlpt.research import checkpoint_eval as ce
  from rlpt.train import progress, settings
  try:
    ks = [int(k) for k in _K.value]
  except ValueError:
    sys.stderr.write(f"launch.eval: --k wants integers, got {_K.value}\n")
    sys.exit(2)
  try:
    s = settings.Settings.from_config(_CONFIG.value)
    if _N.value < 0:
      raise ce.EvalError(f"--n wants samples per task >= 0 (0: greedy only), got {_N.value}")
    for k in (ks if _N.value else ()):
      if not 1 <= k <= _N.value:
        raise ce.EvalError(f"pass@{k} needs 1 <= k <= n = {_N.value} (--k, --n)")
    have = [d for d, _ in s.data.domains] if s.data.holdout_per_domain else []
    unknown = sorted(set(_DOMAINS.value or ()) - set(have))
    if unknown:   # before anything loads
      raise ce.EvalError(f"--domains {unknown} are not among the config's holdout domains "
                         f"{have or '(none: data.holdout_per_domain is 0)'}")
    if logging.get_verbosity() == logging.INFO:
      logging.set_verbosity(logging.WARNING)
    policy = ce.load_policy(s, checkpoint=_CHECKPOINT.value, model=_MODEL.value)
    result = ce.evaluate(policy, n=_N.value, ks=ks, domains=_DOMAINS.value or ())
  except (settings.ConfigError, ce.EvalError) as e:
    sys.stderr.write(f"launch.eval: {e}\n")
    sys.exit(2)
  if _CHECKPOINT.value:
    workdir = ce.resolve(_CHECKPOINT.value)[0]
    out = _OUT.value or os.path.join(workdir, "evals")
    name = _NAME.value or (f"step_{policy.step}" if "SFT" not in policy.label else "sft")
  else:
    out = _OUT.value or "evals"
    name = _NAME.value or os.path.splitext(os.path.basename(os.path.normpath(_MODEL.value)))[0]
  header, rows = ce.table(result)
  what = f"greedy and {_N.value} samples a task" if _N.value else "greedy"
  progress.print_summary(f"{policy.label}: holdout, {what}", header, rows)
  jpath, ppath = ce.write(result, out, name)
  print(f"launch.eval: {jpath}, {ppath}")


if __name__ == "__main__":
  config_cli.run(main)
