"""Evaluates any checkpoint of a run, or a model file, on a config's holdout.

    policy = load_policy(settings, checkpoint="runs/default")      # or model="x.gguf"
    result = evaluate(policy, n=8, ks=(1, 4))
    write(result, "runs/default/evals", "step_30")                 # NAME.json + NAME.png

What a checkpoint path means (WORKDIR is a `launch.train` workdir):
  WORKDIR          the last RL checkpoint (WORKDIR/checkpoints/<latest>)
  WORKDIR/STEP     RL step STEP; step 0 of a run with SFT is WORKDIR/sft's weights
  WORKDIR/sft      the SFT warm-up's weights
A model path (`model=`) is anything `config.model.name` accepts: a HF directory, a
.gguf file, "smollm2-135m-instruct", "tiny".

The holdout is the config's (same seed, same tasks as the run's own evaluations), and
the greedy part is `rlpt.train.evaluation.evaluate` with the run's settings, so a run's
final checkpoint reproduces its final holdout table; the sampled part adds pass@k from
n samples per task at the config's temperature (`evaluate_sampled`). Verification goes
through the reward registry and its pools, as in training.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np


class EvalError(ValueError):
  """A checkpoint or model that cannot be evaluated with this config; says why."""


@dataclasses.dataclass
class Policy:
  """A policy loaded for evaluation: the run's parts, with the engine serving it."""
  parts: Any
  label: str            # what was loaded: "WORKDIR step 30", "x.gguf", ...
  step: int | None      # the RL step (0 = before RL), None for a model file


def _model_fields(config_json: dict) -> dict:
  return config_json.get("model", {})


def resolve(checkpoint: str) -> tuple[str, str, int | None]:
  """(workdir, kind "rl" | "sft", step or None for the latest) of a checkpoint path."""
  path = os.path.normpath(checkpoint)
  tail = os.path.basename(path)
  if tail == "sft":
    return os.path.dirname(path), "sft", None
  if tail.isdigit() and not os.path.exists(os.path.join(path, "config.json")):
    return os.path.dirname(path), "rl", int(tail)
  return path, "rl", None


def load_policy(settings: Any, *, checkpoint: str | None = None, model: str | None = None
                ) -> Policy:
  """Builds the config's policy and engine and loads the weights to evaluate."""
  from rlpt.train import build as build_lib
  from rlpt.train import checkpoint as ckpt_lib
  from rlpt.train import weight_sync as ws_lib
  if (checkpoint is None) == (model is None):
    raise EvalError("give exactly one of a checkpoint (a run's workdir) and a model path")
  s = dataclasses.replace(settings, rollout=dataclasses.replace(settings.rollout, engine="jax"))
  if model is not None:
    from rlpt.train import policy as policy_lib
    why = policy_lib.check_model_name(model)
    if why:
      raise EvalError(why)
    s = dataclasses.replace(s, model=dataclasses.replace(s.model, name=model))
    parts = build_lib.build(s, None)
    return Policy(parts, model, None)

  workdir, kind, step = resolve(checkpoint)
  cfg_path = os.path.join(workdir, "config.json")
  if not os.path.exists(cfg_path):
    raise EvalError(f"{checkpoint}: no run there ({cfg_path} does not exist)")
  with open(cfg_path) as f:
    run_model = _model_fields(json.load(f))
  mine = {"name": s.model.name, "dtype": s.model.dtype,
          "tiny": dict(s.model.tiny) if s.model.tiny else None}
  for field in ("name", "dtype"):
    if run_model.get(field) != mine[field]:
      raise EvalError(f"{checkpoint}: the run's model.{field} is {run_model.get(field)!r}, "
                      f"the config's {mine[field]!r}: evaluate it with the run's config")
  if s.model.name == "tiny" and dict(run_model.get("tiny", {})) != mine["tiny"]:
    raise EvalError(f"{checkpoint}: the run's model.tiny is {run_model.get('tiny')!r}, the "
                    f"config's {mine['tiny']!r}")
  parts = build_lib.build(s, None)
  sync = ws_lib.WeightSync(parts.engine)
  sft_dir = os.path.join(workdir, "sft")
  ck = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=10**6)
  try:
    steps = ck.all_steps()
    if kind == "rl" and step is None:
      if not steps:
        raise EvalError(f"{checkpoint}: the run has no RL checkpoint yet "
                        f"({os.path.join(workdir, 'checkpoints')} is empty)")
      step = max(steps)
    if kind == "rl" and step not in steps and step != 0:
      raise EvalError(f"{checkpoint}: no RL checkpoint at step {step} (steps on disk: "
                      f"{steps or 'none'})")
    if kind == "sft" or (kind == "rl" and step == 0 and 0 not in steps):
      if not os.path.exists(os.path.join(sft_dir, "sft_summary.json")):
        if kind == "sft" or s.sft.steps > 0:
          raise EvalError(f"{checkpoint}: no finished SFT checkpoint in {sft_dir}")
        return Policy(parts, f"{workdir} step 0 (the initial model)", 0)
      from flax import nnx
      sft_ck = ckpt_lib.Checkpointer(sft_dir, keep=10**6)
      try:   # an explicit step: a damaged checkpoint raises, nothing is moved
        info = sft_ck.restore({"params": nnx.state(parts.model)}, step=max(sft_ck.all_steps()))
      except (ckpt_lib.CheckpointError, ValueError) as e:
        raise EvalError(f"{checkpoint}: the SFT checkpoint in {sft_dir}: {e}") from e
      finally:
        sft_ck.close()
      if info is None:
        raise EvalError(f"{checkpoint}: the SFT checkpoint in {sft_dir} could not be read")
      nnx.update(parts.model, info.state["params"])
      sync.sync(parts.model, version=0)
      return Policy(parts, f"{workdir} after SFT", 0)
    import jax
    learner = build_lib.learner(parts)
    try:
      info = ck.restore({"learner": learner.state, "key": jax.random.key(s.seed)}, step=step)
    except ckpt_lib.CheckpointError as e:
      raise EvalError(f"{checkpoint}: {e}") from e
    if info is None:
      raise EvalError(f"{checkpoint}: RL checkpoint {step} could not be read")
    sync.sync(info.state["learner"].params, version=step)
    return Policy(parts, f"{workdir} step {step}", step)
  finally:
    ck.close()


def evaluate(policy: Policy, *, n: int, ks: Sequence[int], domains: Sequence[str] = ()
             ) -> dict[str, Any]:
  """Greedy accuracy (the training loop's evaluation) and n-sample pass@k per domain
  (n = 0: greedy only). Episodic domains are played as `settings.episodes` says
  (with or without their tools)."""
  from rlpt.train import evaluation
  p = policy.parts
  s = p.settings
  holdout = p.holdout
  if domains:
    unknown = sorted(set(domains) - set(holdout))
    if unknown:
      raise EvalError(f"domains {unknown} are not among the config's holdout domains "
                      f"{sorted(holdout) or '(none: data.holdout_per_domain is 0)'}")
    holdout = {d: holdout[d] for d in domains}
  if not holdout:
    raise EvalError("the config has no holdout (data.holdout_per_domain is 0)")
  if n == 0:
    ks = ()
  for k in ks:
    if not 1 <= int(k) <= n:
      raise EvalError(f"pass@{k} needs k <= n = {n} samples per task (--k, --n)")
  greedy = evaluation.evaluate(p.engine, holdout, max_new_tokens=s.rollout.max_new_tokens,
                               reward_config=s.rewards, seed=s.seed, episodes=s.episodes)
  sampled = evaluation.evaluate_sampled(
      p.engine, holdout, n=n, ks=ks, max_new_tokens=s.rollout.max_new_tokens,
      temperature=s.rollout.temperature, top_p=s.rollout.top_p, reward_config=s.rewards,
      seed=s.seed, episodes=s.episodes) if n else {}
  return {"policy": policy.label, "step": policy.step, "n": n, "ks": list(ks),
          "temperature": s.rollout.temperature, "episodes_with_tools": s.episodes.with_tools,
          "greedy": greedy, "sampled": sampled}


def table(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
  """(header, rows): per domain, greedy accuracy with its 95 % interval, pass@k, mean
  score and length of the samples, samples cut at the budget, violations, unscored."""
  ks = result["ks"]
  header = (["domain", "greedy acc (%) [95 %]"] + [f"pass@{k} (%)" for k in ks]
            + ["score", "length", "truncated", "violations", "unscored"])
  rows = []
  for d in sorted(result["greedy"]):
    g, sm = result["greedy"][d], result["sampled"].get(d, {})
    pk = [f"{100 * sm[f'pass@{k}']:.1f}" if not math.isnan(sm.get(f"pass@{k}", math.nan))
          else "-" for k in ks]
    viol = ", ".join(f"{v} {c}" for v, c in sm.get("violations", {}).items()) or "-"
    rows.append([d, f"{100 * g['accuracy']:.1f} [{100 * g['low']:.1f}, {100 * g['high']:.1f}]",
                 *pk, f"{sm.get('score', math.nan):.3f}", f"{sm.get('length', math.nan):.1f}",
                 f"{sm.get('truncated', 0)}/{sm.get('n_samples', 0)}", viol,
                 f"{g.get('unscored', 0)} greedy, {sm.get('unscored', 0)} sampled"])
  return header, rows


def write(result: dict[str, Any], out_dir: str, name: str) -> tuple[str, str]:
  """OUT_DIR/NAME.json and OUT_DIR/NAME.png (grouped bars: greedy accuracy and pass@k
  per domain, with the greedy 95 % interval). Returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  os.makedirs(out_dir, exist_ok=True)
  jpath, ppath = os.path.join(out_dir, f"{name}.json"), os.path.join(out_dir, f"{name}.png")
  with open(jpath + ".tmp", "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  os.replace(jpath + ".tmp", jpath)
  domains = sorted(result["greedy"])
  series = [("greedy", [result["greedy"][d]["accuracy"] for d in domains])]
  series += [(f"pass@{k}", [result["sampled"].get(d, {}).get(f"pass@{k}", math.nan)
                            for d in domains]) for k in result["ks"]]
  x = np.arange(len(domains))
  width = 0.8 / len(series)
  fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(domains) + 2), 4.0))
  for i, (label, vals) in enumerate(series):
    v = 100 * np.asarray(vals, float)
    kw = {}
    if label == "greedy":
      g = [result["greedy"][d] for d in domains]
      kw["yerr"] = [v - [100 * e["low"] for e in g], [100 * e["high"] for e in g] - v]
      kw["capsize"] = 3
    ax.bar(x + (i - (len(series) - 1) / 2) * width, v, width, label=label, **kw)
  ax.set_xticks(x, domains, rotation=20, ha="right", fontsize=8)
  ax.set_ylabel("holdout (%)")
  ax.set_ylim(0, 100)
  ax.set_title(result["policy"], fontsize=9)
  ax.legend(fontsize=8)
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  fig.savefig(ppath, dpi=110)
  plt.close(fig)
  return jpath, ppath
