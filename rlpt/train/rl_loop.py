"""The synchronous RL loop: `train(config, workdir)`.

One step s (1-based; the checkpoint of step s holds the state after it):

  tasks    = mixer.sample(prompts_per_step)                   # DomainMixer
  samples  = engine.generate(k per prompt, seeded per step)   # JaxEngine, in-process
  rewards  = rlpt.rewards.compute_rewards(...)                # parallel verifiers
  (DAPO: drop zero-variance groups, refill; overlong shaping)
  metrics  = learner.step(learner.prepare(batch))             # advantages + loss + Optax
  engine.update_weights(learner params, version=s)            # weight sync
  trajectories/step_s.parquet, metrics.jsonl + TensorBoard, progress bar
  holdout evaluation before RL, every `eval.every` steps (0: none) and after the last
  step; checkpoint every `checkpoint.every` steps and after the last.

Resume: the newest intact checkpoint restores learner state, loop RNG key, mixer
state and the evaluation history; metrics and trajectory files of later steps are
dropped, so the run continues as if never interrupted (same batches, same
losses). Config errors are raised as `ConfigError` before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

from absl import logging
import jax
import numpy as np

from rlpt.data import mixer as mixer_lib
from rlpt.data import trajectories as traj_lib
from rlpt.rollout.engine import SamplingParams
from rlpt.train import checkpoint as ckpt_lib
from rlpt.train import metrics as metrics_lib
from rlpt.train import progress as progress_lib
from rlpt.train import rollouts as ro
from rlpt.train import setup
from rlpt.train import sft as sft_lib


# Crash tests set this to a step number: the process SIGKILLs itself right after
# that step's metrics are written and its checkpoint save has started.
FAULT_ENV = "RLPT_FAULT_AFTER_STEP"


@dataclasses.dataclass
class RunResult:
  """What `train` returns: the last step, the final metrics row and the
  evaluation history {step: {domain: {"accuracy", "score", "n"}}}."""

  step: int
  last_metrics: dict[str, Any]
  evals: dict[int, dict[str, dict[str, float]]]
  resumed_from: int


def _step_seeds(key: jax.Array, count: int) -> tuple[jax.Array, np.ndarray]:
  key, sub = jax.random.split(key)
  return key, np.asarray(jax.random.randint(sub, (count,), 0, 2 ** 31 - 1), np.int64)


def _rollout_round(ctx: setup.Context, tasks, seeds, first_group: int):
  c = ctx.config
  t0 = time.perf_counter()
  comps = ctx.engine.generate(ro.make_requests(tasks, n=c.rollout.n, sampling=ctx.sampling,
                                               seeds=seeds))
  t_gen = time.perf_counter() - t0
  rollouts = ro.to_rollouts(tasks, comps, n=c.rollout.n, first_group=first_group)
  t_ver = ro.verify(rollouts, ctx.reward_config)
  return rollouts, t_gen, t_ver


def _collect(ctx: setup.Context, key: jax.Array):
  """Generates and verifies one step's groups (DAPO: refilled past zero-variance
  groups). Returns (key, trained rollouts, every rollout, timings, dropped groups)."""
  c = ctx.config
  n, G = c.rollout.n, c.data.prompts_per_step
  every, trained, t_gen, t_ver, dropped = [], [], 0.0, 0.0, 0
  if not c.rl.dynamic_sampling:
    tasks = ctx.mixer.sample(G)
    key, seeds = _step_seeds(key, G)
    every, t_gen, t_ver = _rollout_round(ctx, tasks, seeds, 0)
    return key, every, every, (t_gen, t_ver), 0
  from rlpt.algorithms import dapo
  sampler = dapo.DynamicSampler(G, n)  # fresh per step: no surplus outlives a checkpoint
  rounds = 0
  while not sampler.full and rounds <= c.rl.max_refill_rounds:
    need = G if rounds == 0 else G - sampler.held
    tasks = ctx.mixer.sample(need)
    key, seeds = _step_seeds(key, need)
    rs, tg, tv = _rollout_round(ctx, tasks, seeds, len(every) // n)
    every += rs
    t_gen, t_ver = t_gen + tg, t_ver + tv
    groups = [rs[i:i + n] for i in range(0, len(rs), n)]
    sampler.add(shaped_rewards(c, rs), groups)
    rounds += 1
  _, kept = sampler.take(allow_partial=True)
  dropped = sampler.dropped
  trained = [r for g in kept for r in g]
  return key, trained, every, (t_gen, t_ver), dropped


def shaped_rewards(config: Any, rollouts) -> np.ndarray:
  """float32[B]: the verifier's reward plus DAPO's overlong shaping when
  `rl.overlong_buffer` > 0 (what the learner and dynamic sampling see)."""
  r = np.array([x.reward.reward for x in rollouts], np.float32)
  if config.rl.get("overlong_buffer", 0) > 0:
    from rlpt.algorithms import dapo
    r = r + np.asarray(dapo.overlong_penalty(
        [len(x.completion_ids) for x in rollouts], max_len=config.rollout.max_new_tokens,
        buffer=int(config.rl.overlong_buffer), penalty=float(config.rl.overlong_penalty)))
  return r


def _update(ctx: setup.Context, trained) -> tuple[dict[str, float], np.ndarray]:
  """One learner update on `trained`; returns host metrics and per-row advantages
  (mean over each row's completion tokens)."""
  from rlpt.train.learner import metrics_to_host
  c = ctx.config
  rows = c.data.prompts_per_step * c.rollout.n  # one compiled shape, even for short batches
  multiple = int(c.rl.get("length_multiple", 64))
  arrays = ro.pack(trained, pad_id=ctx.pad_id, rows=rows, length_multiple=multiple)
  rewards = np.zeros((rows,), np.float32)
  rewards[:len(trained)] = shaped_rewards(c, trained)
  batch = ctx.learner.prepare(arrays["tokens"], arrays["attention_mask"], arrays["loss_mask"],
                              arrays["old_logprobs"], rewards, group_size=c.rollout.n,
                              pad_multiple=multiple)
  adv, mask = jax.device_get((batch.advantages, batch.loss_mask))
  per_row = ((adv * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1))[:len(trained)]
  metrics = metrics_to_host(ctx.learner.step(batch))
  return metrics, per_row


def _evaluate(ctx: setup.Context) -> dict[str, dict[str, float]]:
  return ro.evaluate(ctx.engine, ctx.holdout, max_new_tokens=ctx.config.rollout.max_new_tokens,
                     reward_config=ctx.reward_config, seed=ctx.config.seed)


def _write_evals(workdir, evals, stage_names) -> None:
  """WORKDIR/evals.json: {step: {"stage", "domains": {domain: {...}}}}, atomically."""
  import json
  path = os.path.join(workdir.root, "evals.json")
  out = {str(k): {"stage": stage_names.get(k, f"step {k}"), "domains": v}
         for k, v in sorted(evals.items())}
  with open(path + ".tmp", "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
  os.replace(path + ".tmp", path)


def _eval_row(ev: dict[str, dict[str, float]]) -> dict[str, float]:
  row = {f"eval/accuracy/{d}": v["accuracy"] for d, v in ev.items()}
  row.update({f"eval/score/{d}": v["score"] for d, v in ev.items()})
  if ev:
    row["eval/accuracy"] = float(np.mean([v["accuracy"] for v in ev.values()]))
  return row


def train(config: Any, workdir: Any) -> RunResult:
  """Runs (or resumes) the RL experiment `config` in `workdir` (a Workdir or path)."""
  from rlpt.train import workdir as workdir_lib
  if isinstance(workdir, str):
    workdir = workdir_lib.prepare_workdir(workdir, config)
  setup.check_config(config)                       # raises ConfigError: nothing loaded yet
  ctx = setup.build(config, workdir)               # model, engine, mixer, holdout
  c = config
  ckpt = ckpt_lib.Checkpointer(workdir.checkpoints, keep=c.checkpoint.keep)
  store = traj_lib.TrajectoryStore(workdir.trajectories)
  writer = metrics_lib.MetricsWriter(workdir.root)
  key = jax.random.key(c.seed)
  has_ckpt = ckpt.latest_step() is not None
  evals: dict[int, dict] = {}
  sft_cfg = sft_lib.SFTConfig.from_config(c)
  stage_names = {0: "before RL"}
  if sft_cfg.steps > 0:
    stage_names = {-1: "base", 0: "after SFT"}
    if not has_ckpt and ctx.holdout:
      evals[-1] = _evaluate(ctx)
    sft_bar = progress_lib.ProgressBar(total=sft_cfg.steps, desc="sft")
    try:
      res = sft_lib.run_sft(ctx.model, ctx.tokenizer, ctx.sources, sft_cfg,
                            os.path.join(workdir.root, "sft"), pad_id=ctx.pad_id,
                            log=lambda s, loss: sft_bar.update(s, loss=loss))
    finally:
      sft_bar.close()
    logging.warning("SFT: %d steps, loss %.3f -> %.3f (%s)", res["steps"], res["losses"][0],
                    res["losses"][-1], "restored" if res["restored"] else f"{res['seconds']:.0f} s")
    ctx.engine.update_weights(ctx.model, version=0)
  setup.make_learner(ctx)
  start = 0
  info = ckpt.restore({"learner": ctx.learner.state, "key": key})
  if info is not None:
    ctx.learner.state = info.state["learner"]
    key = info.state["key"]
    ctx.mixer.set_state(info.extra["mixer"])
    evals = {int(k): v for k, v in info.extra["evals"].items()}
    start = info.step
    ctx.engine.update_weights(ctx.learner.state.params, version=start)
    dropped = writer.truncate_after(start)
    gone = store.discard_after(start)
    logging.warning("resumed from step %d (dropped %d metric rows, %d trajectory files)%s",
                    start, dropped, len(gone),
                    f"; skipped corrupt checkpoints {info.skipped}" if info.skipped else "")
  else:
    writer.truncate_after(0)
    store.discard_after(0)
  if 0 not in evals and ctx.holdout:
    evals[0] = _evaluate(ctx)
  _write_evals(workdir, evals, stage_names)

  def save(step):
    ckpt.save(step, {"learner": ctx.learner.state, "key": key},
              {"mixer": ctx.mixer.get_state(), "evals": {str(k): v for k, v in evals.items()},
               "weight_version": step})

  row: dict[str, Any] = {}
  bar = progress_lib.ProgressBar(total=c.total_steps, desc="rl", initial=start)
  try:
    for step in range(start + 1, c.total_steps + 1):
      t_step = time.perf_counter()
      key, trained, every, (t_gen, t_ver), dropped = _collect(ctx, key)
      t0 = time.perf_counter()
      if trained:
        learner_metrics, advantages = _update(ctx, trained)
      else:  # DAPO found no group with signal within its refill budget
        learner_metrics, advantages = {"loss": 0.0, "skipped_update": 1.0}, None
      t_train = time.perf_counter() - t0
      t0 = time.perf_counter()
      ctx.engine.update_weights(ctx.learner.state.params, version=step)
      t_sync = time.perf_counter() - t0
      adv_all = np.full(len(every), np.nan)
      if advantages is not None:
        ids = {id(r): i for i, r in enumerate(trained)}
        for j, r in enumerate(every):
          if id(r) in ids:
            adv_all[j] = advantages[ids[id(r)]]
      store.write_step(step, every, advantages=adv_all)
      ctx.mixer.update(mixer_lib.domain_scores([r.task.domain for r in every],
                                               [r.reward.score for r in every]))
      rewards = np.array([r.reward.reward for r in every])
      row = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
             "score_mean": float(np.mean([r.reward.score for r in every])),
             "response_len": float(np.mean([len(r.completion_ids) for r in every])),
             "dropped_groups": dropped, "weight_version": step,
             "time/rollout_s": t_gen, "time/verify_s": t_ver, "time/train_s": t_train,
             "time/sync_s": t_sync}
      row.update({f"reward_mean/{d}": v for d, v in ro.domain_means(every).items()})
      row.update({f"mixer/prob/{d}": p for d, p in ctx.mixer.probabilities().items()})
      row.update({k: float(v) for k, v in learner_metrics.items()})
      if ctx.holdout and (step == c.total_steps
                          or (c.eval.every > 0 and step % c.eval.every == 0)):
        evals[step] = _evaluate(ctx)
        row.update(_eval_row(evals[step]))
        _write_evals(workdir, evals, stage_names)
      row["time/step_s"] = time.perf_counter() - t_step
      writer.write(step, row)
      if step % c.checkpoint.every == 0 or step == c.total_steps:
        save(step)
      if os.environ.get(FAULT_ENV) == str(step):  # crash tests: die like a lost machine
        os.kill(os.getpid(), signal.SIGKILL)
      bar.update(step, reward=row["reward_mean"], loss=row.get("loss", float("nan")),
                 rollout=f"{t_gen:.1f}s", verify=f"{t_ver:.1f}s", train=f"{t_train:.1f}s",
                 sync=f"{t_sync:.2f}s")
  finally:
    bar.close()
    ckpt.close()
    writer.close()
  stage_names[c.total_steps] = f"after RL ({c.total_steps} steps)"
  _print_summary(evals, stage_names)
  run_rows = metrics_lib.summarize_run(metrics_lib.read_metrics(workdir.root))
  if run_rows:
    progress_lib.print_summary("run summary", ["", "value"], run_rows)
  return RunResult(step=c.total_steps, last_metrics=row, evals=evals, resumed_from=start)


def _print_summary(evals: dict[int, dict], stage_names: dict[int, str]) -> None:
  if not evals:
    return
  steps = sorted(evals)
  cols = [stage_names.get(s, f"step {s}") for s in steps]
  domains = sorted({d for e in evals.values() for d in e})
  rows = [[d] + [f"{100 * evals[s][d]['accuracy']:.1f}" if d in evals[s] else "-"
                 for s in steps] for d in domains]
  progress_lib.print_summary("holdout accuracy (%) per domain", ["domain"] + cols, rows)
