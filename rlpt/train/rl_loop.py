"""The RL loop: `train(config, workdir)`.

One step s (1-based; the checkpoint of step s holds the state after it) is the three
stages of ARCHITECTURE.md's diagram:

  key, batch = collector.collect(key)      # mixer -> engine -> verifiers -> RolloutBatch
  metrics, adv = learner.update(batch)     # advantages + loss + Optax, packed once
  weight_sync.sync(learner params, s)      # in process, or Orbax publish + fleet load

With `rl.mode = "async"` the first stage runs ahead on producer threads
(rlpt.train.async_collector): `collect(learner.version)` takes finished groups from a
bounded buffer, dropping those more than `rl.max_staleness` versions old, while the
fleet keeps generating through the update and the weight sync.

then bookkeeping: trajectories/step_s.parquet (every rollout, with its advantage),
metrics.jsonl + TensorBoard, the mixer's statistics, the progress bar; holdout
evaluation before RL, every `eval.every` steps (0: none) and after the last step;
a checkpoint every `checkpoint.every` steps and after the last.

Resume: the newest intact checkpoint restores learner state, loop RNG key, mixer state
and the evaluation history; metrics and trajectory files of later steps are dropped, so
the run continues as if never interrupted (same batches, same losses). In async mode
the checkpoint also holds the collector's buffer (finished untrained groups, and the
tasks and seeds of rounds in flight, which run again first): every drawn group is
trained at most once and none is lost, though the run is not bit-identical (which
round finishes first is timing). The config is
read once (rlpt.train.settings) and a bad one raises ConfigError before any model loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from typing import Any, Sequence

from absl import logging
import jax

from rlpt.data import mixer as mixer_lib
from rlpt.data import trajectories as traj_lib
from rlpt.train import build as build_lib
from rlpt.train import checkpoint as ckpt_lib
from rlpt.train import distributed
from rlpt.train import metrics as metrics_lib
from rlpt.train import progress as progress_lib
from rlpt.train import sft as sft_lib
from rlpt.train.async_collector import AsyncCollector
from rlpt.train.collector import Collector
from rlpt.train import evaluation, intervals
from rlpt.train.settings import Settings

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


class _Evals:
  """The holdout history {step: {domain: ...}} and WORKDIR/evals.json."""

  def __init__(self, parts: build_lib.Parts, root: str):
    self.parts, self.path = parts, os.path.join(root, "evals.json")
    s = parts.settings
    base = ("base" if s.eval_base_tasks < 0 or s.eval_base_tasks >= s.data.holdout_per_domain
            else f"base (first {s.eval_base_tasks})")
    self.names = {-1: base, 0: "after SFT"} if s.sft.steps > 0 else {0: "before RL"}
    self.history: dict[int, dict] = {}
    self.engine = build_lib.EvalEngine(parts)
    self._constants: dict[str, dict[str, Any]] | None = None

  def constants(self) -> dict[str, dict[str, Any]]:
    """Per domain, the free baseline: the best constant answer (most frequent reference
    answer of the train split) and its accuracy on this holdout (rlpt.train.reward_audit)."""
    if self._constants is None:
      from rlpt.train.reward_audit import constant_baseline
      s = self.parts.settings
      self._constants = {}
      for d, tasks in sorted(self.parts.holdout.items()):
        answer, acc = constant_baseline(self.parts.sources[d], tasks, reward_config=s.rewards)
        self._constants[d] = {"answer": answer, "accuracy": acc}
    return self._constants

  def rotation(self, step: int) -> list[str] | None:
    """The domains an intermediate evaluation at `step` scores when
    eval.domains_per_eval = k > 0: the next k of the sorted domains, in turn (a pure
    function of the step, so a resumed run rotates the same way); None = all."""
    s = self.parts.settings
    domains = sorted(self.parts.holdout)
    k = s.eval_domains
    if k <= 0 or k >= len(domains) or step <= 0 or step >= s.total_steps or not s.eval_every:
      return None
    first = ((step // s.eval_every - 1) * k) % len(domains)
    return [domains[(first + i) % len(domains)] for i in range(k)]

  def run(self, step: int, params: Any, domains: Sequence[str] | None = None
          ) -> dict[str, float]:
    """Evaluates `params` as `step` (on `domains` only, when given) on the eval engine
    (eval.engine; the rollout engine must already serve them); returns the metrics
    fields."""
    s = self.parts.settings
    holdout = self.parts.holdout
    if domains is not None:
      holdout = {d: holdout[d] for d in domains}
    if step < 0 and s.eval_base_tasks >= 0:  # the base model: a prefix of each holdout
      holdout = {d: list(t[:s.eval_base_tasks]) for d, t in holdout.items()}
    engine = self.engine.serving(params, version=max(step, 0))
    self.history[step] = evaluation.evaluate(engine, holdout,
                                  max_new_tokens=s.rollout.max_new_tokens,
                                  reward_config=s.rewards, seed=s.seed,
                                  episodes=s.episodes)
    self.write()
    return evaluation.eval_metrics(self.history[step])

  def write(self) -> None:
    """WORKDIR/evals.json: {step: {"stage", "domains": {domain: {...}}}}, atomically
    (by process 0 of a multi-process run)."""
    if not distributed.is_primary():
      return
    out = {str(k): {"stage": self.names.get(k, f"step {k}"), "domains": v}
           for k, v in sorted(self.history.items())}
    if self.parts.holdout:
      out["constant_baseline"] = self.constants()
    with open(self.path + ".tmp", "w") as f:
      json.dump(out, f, indent=1, sort_keys=True)
    os.replace(self.path + ".tmp", self.path)

  def table(self) -> tuple[list[str], list[list[str]]]:
    """The holdout table: per domain, accuracy (%) with its 95 % Wilson interval at each
    evaluation, the paired gain of the last evaluation over the RL start (step 0) with
    its 95 % interval (rlpt.train.intervals.paired_gain), and the constant baseline."""
    steps = sorted(self.history)
    domains = sorted({d for e in self.history.values() for d in e})
    const = self.constants()
    gains = self.gains()
    with_gain = bool(gains)
    header = (["domain"] + [self.names.get(s, f"step {s}") for s in steps]
              + ([self.gain_name()] if with_gain else []) + ["constant"])
    rows = []
    for d in domains:
      row = [d]
      for s in steps:
        e = self.history[s].get(d)
        row.append("-" if e is None else _fmt_acc(e))
      if with_gain:
        row.append(gains[d].format(signed=True) if d in gains else "-")
      c = const.get(d, {}).get("accuracy", float("nan"))
      row.append(f"{100 * c:.1f}" if c == c else "-")
      rows.append(row)
    return header, rows

  def gain_name(self) -> str:
    return "RL - SFT" if self.parts.settings.sft.steps > 0 else "RL - start"

  def gains(self) -> dict[str, intervals.Interval]:
    """{domain: paired gain of the last evaluation over step 0} (empty before RL)."""
    steps = sorted(self.history)
    if not steps or steps[-1] <= 0 or 0 not in self.history:
      return {}
    out = {}
    for d, e in self.history[steps[-1]].items():
      g = evaluation.gain(e, self.history[0].get(d, {}))
      if g is not None:
        out[d] = g
    return out

  def print_table(self) -> None:
    if self.history and distributed.is_primary():
      header, rows = self.table()
      progress_lib.print_summary("holdout accuracy (%) per domain, 95 % intervals", header,
                                 rows)


class _NoFiles:
  """What a process other than 0 of a multi-process run has for the metrics writer and
  the trajectory stores: the same calls, nothing written (process 0 writes them)."""

  def write_step(self, *a, **k) -> None:
    pass

  def write(self, *a, **k) -> None:
    pass

  def discard_after(self, step: int) -> list:
    return []

  def truncate_after(self, step: int) -> int:
    return 0

  def close(self) -> None:
    pass


def _fmt_acc(e: dict[str, Any]) -> str:
  """'41.4 [29.3, 53.0]' from one domain's evaluation (the bare accuracy for an older
  evals.json without intervals), with the count of tasks whose verifier failed."""
  text = (intervals.Interval(e["accuracy"], e["low"], e["high"]).format() if "low" in e
          else f"{100 * e['accuracy']:.1f}")
  return text + (f" ({e['unscored']} unscored)" if e.get("unscored") else "")


def _async_postfix(row: dict[str, Any]) -> dict[str, str]:
  """The progress bar's async fields: staleness (mean/max of the trained rows), buffer
  fill, and the engine's and the learner's busy fractions so far."""
  return {"stale": f"{row.get('staleness', 0):.1f}/{row.get('staleness_max', 0):.0f}",
          "buf": f"{row['async/buffered_groups']:.0f}/{row['async/buffer_capacity']:.0f}",
          "eng": f"{100 * row['async/engine_busy']:.0f}%",
          "lrn": f"{100 * row['async/learner_busy']:.0f}%"}


def _sft(parts: build_lib.Parts, root: str) -> None:
  """The supervised warm-up (restored when a finished one is on disk)."""
  s = parts.settings
  bar = progress_lib.ProgressBar(total=s.sft.steps, desc="sft",
                                disable=not distributed.is_primary())
  try:
    res = sft_lib.run_sft(parts.model, parts.tokenizer, parts.sources, s.sft,
                          os.path.join(root, "sft"), pad_id=parts.pad_id,
                          log=lambda step, loss: bar.update(step, loss=loss), mesh=parts.mesh)
  finally:
    bar.close()
  logging.warning("SFT: %d steps, loss %.3f -> %.3f (%s)", res["steps"], res["losses"][0],
                  res["losses"][-1], "restored" if res["restored"] else f"{res['seconds']:.0f} s")


def train(config: Any, workdir: Any) -> RunResult:
  """Runs (or resumes) the RL experiment `config` in `workdir` (a Workdir or path)."""
  from rlpt.train import workdir as workdir_lib
  settings = Settings.from_config(config)          # ConfigError: nothing loaded yet
  if isinstance(workdir, str):
    workdir = workdir_lib.prepare_workdir(workdir, config)
  parts = build_lib.build(settings, workdir)       # model, engine, mixer, holdout
  try:
    return _run(parts, workdir)
  finally:
    close = getattr(parts.engine, "shutdown", None)
    if close is not None:
      close()


def _run(parts: build_lib.Parts, workdir: Any) -> RunResult:
  s = parts.settings
  ckpt = ckpt_lib.Checkpointer(workdir.checkpoints, keep=s.checkpoint_keep)
  primary = distributed.is_primary()   # writes metrics and trajectories (multi-process)
  store = traj_lib.TrajectoryStore(workdir.trajectories) if primary else _NoFiles()
  dead_store = traj_lib.TrajectoryStore(workdir.dead_letter) if primary else _NoFiles()
  writer = metrics_lib.MetricsWriter(workdir.root) if primary else _NoFiles()
  evals = _Evals(parts, workdir.root)
  weight_sync = build_lib.weight_sync(parts, workdir)
  key = jax.random.key(s.seed)
  if s.sft.steps > 0:
    if ckpt.latest_step() is None and parts.holdout and s.eval_base_tasks != 0:
      evals.run(-1, parts.model)
    _sft(parts, workdir.root)
    weight_sync.sync(parts.model, version=0)
  learner = build_lib.learner(parts)
  start = 0
  info = ckpt.restore({"learner": learner.state, "key": key})
  if info is not None:
    learner.state, key, start = info.state["learner"], info.state["key"], info.step
    learner.version = int(info.extra["weight_version"])
    parts.mixer.set_state(info.extra["mixer"])
    evals.history = {int(k): v for k, v in info.extra["evals"].items()}
    dead_store.discard_after(start)
    logging.warning("resumed from step %d (dropped %d metric rows, %d trajectory files)%s",
                    start, writer.truncate_after(start), len(store.discard_after(start)),
                    f"; skipped corrupt checkpoints {info.skipped}" if info.skipped else "")
  else:
    writer.truncate_after(0)
    store.discard_after(0)
    dead_store.discard_after(0)
  weight_sync.restart(learner.state.params, version=start)
  if 0 not in evals.history and parts.holdout:
    evals.run(0, learner.state.params)
    parts.mixer.observe_holdout({d: e["accuracy"] for d, e in evals.history[0].items()})
  evals.write()
  is_async = s.rl.mode == "async"
  if is_async:
    collector: Any = AsyncCollector(s, parts.mixer, parts.engine, pad_id=parts.pad_id, key=key,
                                    learner_version=learner.version)
    mixer_lock: Any = collector.lock
    if info is not None and "async_buffer" in info.extra:
      collector.restore(info.extra["async_buffer"])
  else:
    collector, mixer_lock = Collector(s, parts.mixer, parts.engine, pad_id=parts.pad_id), None
  mixer_lock = mixer_lock or contextlib.nullcontext()

  row: dict[str, Any] = {}
  bar = progress_lib.ProgressBar(total=s.total_steps, desc="rl", initial=start,
                                disable=not primary)
  t_loop, learner_busy = time.perf_counter(), 0.0
  finished = False
  try:
    if is_async:
      collector.start()
    for step in range(start + 1, s.total_steps + 1):
      t_step = time.perf_counter()
      if is_async:
        batch = collector.collect(learner.version)
        if step == s.total_steps:
          collector.request_stop()  # nothing more to train: the fleet is the eval's now
      else:
        key, batch = collector.collect(key)
      t0 = time.perf_counter()
      learner_metrics, advantages = learner.update(batch)
      t_train = time.perf_counter() - t0
      # async: the version is on disk when sync returns; the fleet loads it while the
      # learner goes on (the next sync, an evaluation or the end waits for that load)
      t_sync = weight_sync.sync(learner.state.params, version=step, wait=not is_async)
      learner_busy += t_train + t_sync
      recorded, outcomes, errors = batch.recorded()
      adv = list(batch.per_rollout(advantages))
      adv += [float("nan")] * (len(recorded) - len(adv))
      store.write_step(step, recorded, advantages=adv, outcomes=outcomes, errors=errors)
      if batch.dead:  # WORKDIR/dead_letter/: the groups that will never train, and why
        dead_store.write_step(step, [r for r, _ in batch.dead], errors=[e for _, e in batch.dead],
                              outcomes=["dead_letter"] * len(batch.dead))
      with mixer_lock:
        parts.mixer.update(mixer_lib.domain_scores([r.task.domain for r in batch.rollouts],
                                                   [r.reward.score for r in batch.rollouts]))
        probs = parts.mixer.probabilities()
      row = batch.metrics()
      row.update({"weight_version": step, "time/train_s": t_train, "time/sync_s": t_sync})
      row.update({f"mixer/prob/{d}": p for d, p in probs.items()})
      row.update(learner_metrics)
      if is_async:
        row.update(collector.metrics())
        row["time/sync_load_s"] = weight_sync.last_load_seconds  # a staged publish + load
        row["async/learner_busy"] = learner_busy / max(time.perf_counter() - t_loop, 1e-9)
      if parts.holdout and (step == s.total_steps
                            or (s.eval_every > 0 and step % s.eval_every == 0)):
        if not evals.engine.separate:
          weight_sync.wait()  # the rollout engine scores the holdout on this step's weights
        row.update(evals.run(step, learner.state.params, evals.rotation(step)))
        with mixer_lock:   # the forgetting guard (data.forgetting_margin)
          flagged = parts.mixer.observe_holdout(
              {d: e["accuracy"] for d, e in evals.history[step].items()})
          row.update({f"mixer/prob/{d}": p for d, p in parts.mixer.probabilities().items()})
        row["forgetting/domains"] = len(flagged)
        row.update({f"forgetting/{d}": float(d in flagged) for d in sorted(parts.holdout)})
      row["time/step_s"] = time.perf_counter() - t_step
      writer.write(step, row)
      if step % s.checkpoint_every == 0 or step == s.total_steps:
        extra = {"weight_version": step,
                 "evals": {str(k): v for k, v in evals.history.items()}}
        if is_async:  # one instant: the key, the mixer and the buffer agree
          key, extra["mixer"], extra["async_buffer"] = collector.snapshot()
        else:
          extra["mixer"] = parts.mixer.get_state()
        ckpt.save(step, {"learner": learner.state, "key": key}, extra)
      if os.environ.get(FAULT_ENV) == str(step):  # crash tests: die like a lost machine
        os.kill(os.getpid(), signal.SIGKILL)
      bar.update(step, reward=row["reward_mean"], loss=row.get("loss", float("nan")),
                 **(_async_postfix(row) if is_async else dict(
                     rollout=f"{batch.seconds_generate:.1f}s",
                     verify=f"{batch.seconds_verify:.1f}s")),
                 train=f"{t_train:.1f}s", sync=f"{t_sync:.2f}s",
                 **({"forgetting": ",".join(parts.mixer.forgetting)}
                    if parts.mixer.forgetting else {}))
    weight_sync.wait()
    finished = True
  finally:
    if is_async:  # after a failure, producers blocked in generate are not waited for long
      collector.stop(timeout_s=600.0 if finished else 10.0)
    bar.close()
    ckpt.close()
    writer.close()
  evals.names[s.total_steps] = f"after RL ({s.total_steps} steps)"
  evals.print_table()
  if not primary:
    return RunResult(step=s.total_steps, last_metrics=row, evals=evals.history,
                     resumed_from=start)
  run_rows = metrics_lib.summarize_run(metrics_lib.read_metrics(workdir.root))
  run_rows += [(f"{evals.gain_name()} {d} (paired 95 %)", g.format(signed=True))
               for d, g in sorted(evals.gains().items())]
  if run_rows:
    progress_lib.print_summary("run summary", ["", "value"], run_rows)
  return RunResult(step=s.total_steps, last_metrics=row, evals=evals.history, resumed_from=start)
