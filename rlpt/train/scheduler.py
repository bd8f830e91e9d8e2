"""The round scheduler: one generation round's tasks -> verified groups, with every
failure classified by one table and handled by its class.

    scheduler = Scheduler(settings.scheduler, engine, sources, tokenizer,
                          reward_config=settings.rewards, max_prompt_len=settings.rollout.max_prompt_len)
    rnd = scheduler.run(tasks, seeds, n=8, sampling=sampling, first_group=g0)
    rnd.groups        # [(group id, [n verified Rollouts])], in task order
    rnd.dead          # [DeadLetter]: groups that will never train, with the reason
    rnd.retried       # [(Rollout, error)]: failed attempts, recorded, never trained

Both collectors (sync `Collector`, async `AsyncCollector`) run their rounds through
it; the caller records `retried` and `dead` in trajectories/ (outcomes "retried" and
"dead_letter"), writes `dead` to WORKDIR/dead_letter/, and tells the mixer to stop
drawing a dead-lettered task (`DomainMixer.exclude`).

FAILURES is the one table of what can go wrong in a round and how it is handled:
  * transient (infrastructure that may work on another try: a fleet member that
    died, restarted or timed out, a sandbox that could not run, a verifier worker
    pool that died): retried with exponential backoff (`backoff_s` x 2^k) up to
    `max_attempts` attempts of that stage, then raised (`SchedulerError`): the run
    stops and resumes from its last checkpoint. Never scored.
  * deterministic (the same input fails the same way: a prompt longer than the
    engine's context, a task whose reference answer fails its own verifier, a
    verifier that raises on the same completion twice): the group is dead-lettered:
    never trained, never retried, its task never drawn again.

A group is trained whole or not at all: a group with any failed member is retried
(transient) or dead-lettered (deterministic) as a whole, since training the members
that happened to succeed would bias group-relative advantages toward easy cases.

Tasks of episodic domains (rlpt.envs.registry: "python_tool", "code_repair") are played as n
episodes each, beside the round's single-turn requests (rlpt.train.generation); a
group of episodes is verified, retried and dead-lettered like any other group, and
a sandbox session that dies under an episode is a transient failure ("sandbox_lost").

Caps, not failures: `rollout.max_new_tokens` and `rollout.max_wall_s` (seconds, per
sample, from its admission into a decode slot: SamplingParams.max_wall_s) end a
runaway sample with the tokens it has (finish_reason "length" / "time", metric
`wall_capped`); it is verified and trained like any sample cut at its budget, so one
sample cannot hold a round. Episodes have their own caps (config.episodes).

Within one generation call the fleet itself re-dispatches a request whose member died
(`Fleet.max_attempts`); the completion then carries `attempt` > 1, and so does the
rollout the learner trains.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging

from rlpt.rewards import registry
from rlpt.rollout.engine import RolloutEngine, SamplingParams
from rlpt.train import generation
from rlpt.train.generation import (EpisodeSettings, prompt_length, requests_for,  # noqa: F401
                                   to_rollouts)
from rlpt.types import Rollout, Task, task_key

TRANSIENT = "transient"
DETERMINISTIC = "deterministic"


@dataclasses.dataclass(frozen=True)
class FailureKind:
  """One row of FAILURES: the class ("transient" | "deterministic"), the stage that
  meets it, and what the scheduler does."""

  klass: str
  stage: str
  handling: str


FAILURES: dict[str, FailureKind] = {
    "engine_unavailable": FailureKind(
        TRANSIENT, "generate",
        "the engine or fleet could not generate (every member down, HTTP timeout or "
        "connection lost past the fleet's own re-dispatches): the round's generation is "
        "retried with backoff"),
    "sandbox_lost": FailureKind(
        TRANSIENT, "generate",
        "an episode's sandbox session died under it (rlpt.sandbox.SessionLost: the "
        "sandbox itself failed, not the model's program): the round's generation, its "
        "episodes with it, is retried with backoff"),
    "verifier_unavailable": FailureKind(
        TRANSIENT, "verify",
        "rlpt.rewards.VerifierUnavailable (a sandbox infra_error, e.g. a killed runsc "
        "process, or a verifier worker pool that cannot start): the round's verification "
        "is retried with backoff"),
    "verifier_raised": FailureKind(
        TRANSIENT, "verify",
        "the verifier raised (or its worker process died) on a completion: that "
        "completion is verified again after a backoff"),
    "verifier_raised_twice": FailureKind(
        DETERMINISTIC, "verify",
        "the verifier raised on the same completion twice: the group is dead-lettered"),
    "prompt_too_long": FailureKind(
        DETERMINISTIC, "admit",
        "the rendered prompt is longer than the engine's context (rollout.max_prompt_len): "
        "the group is dead-lettered before generation"),
    "reference_fails": FailureKind(
        DETERMINISTIC, "admit",
        "the task source's reference completion does not score 1 under the domain's "
        "verifier (a broken task): the group is dead-lettered before generation"),
}


def failure_class(kind: str) -> str:
  """'transient' or 'deterministic' for a FAILURES key (KeyError for any other)."""
  return FAILURES[kind].klass


def classify_exception(e: BaseException) -> str | None:
  """The FAILURES kind of an exception raised by a round's generation or verification,
  or None when it is not an infrastructure failure the scheduler knows (a bug: raised
  as it is)."""
  from rlpt.rollout.client import SGLangError, SGLangRequestError  # aiohttp: on failure only
  from rlpt.rollout.fleet_members import FleetError, MemberDown
  from rlpt.sandbox import SessionLost
  if isinstance(e, registry.VerifierUnavailable):
    return "verifier_unavailable"
  if isinstance(e, SessionLost):
    return "sandbox_lost"
  if isinstance(e, SGLangRequestError):
    return None  # the server refused the request itself: no retry helps
  if isinstance(e, (FleetError, MemberDown, SGLangError, TimeoutError, ConnectionError)):
    return "engine_unavailable"
  return None


class SchedulerError(RuntimeError):
  """A transient failure persisted past `max_attempts` (the cause is chained): the
  run stops rather than score or skip anything."""


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
  """config.scheduler: `max_attempts` per stage for transient failures (>= 1),
  `backoff_s` before the 2nd attempt (doubling after), `check_references`: verify each
  new task's reference completion (once per task) before generating for it."""

  max_attempts: int = 3
  backoff_s: float = 0.5
  check_references: bool = True


@dataclasses.dataclass
class DeadLetter:
  """A group that will never train: its task, the FAILURES kind, the reason (the
  error text) and whatever rollouts it had (none when it failed before generation)."""

  task: Task
  group_id: int
  kind: str
  reason: str
  rollouts: list[Rollout]


@dataclasses.dataclass
class Round:
  """What `Scheduler.run` returns (see the module docstring)."""

  groups: list[tuple[int, list[Rollout]]]
  dead: list[DeadLetter]
  retried: list[tuple[Rollout, str]]
  seconds_generate: float = 0.0
  seconds_verify: float = 0.0
  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  # ^ FAILURES kind -> times met in this round


def placeholder(task: Task, group_id: int, version: int, reason: str) -> Rollout:
  """The record of a group that has no completion (failed before or during
  generation): empty ids and text, finish_reason `reason`."""
  return Rollout(task=task, prompt_ids=[], completion_ids=[], completion_text="", logprobs=[],
                 weight_version=int(version), finish_reason=reason, group_id=group_id)


def _copy(r: Rollout) -> Rollout:
  return dataclasses.replace(r, reward=None)


class Scheduler:
  """Runs rounds (see the module docstring).

  Args:
    settings: SchedulerSettings.
    engine: any RolloutEngine (JaxEngine or Fleet).
    sources: domain -> task source (its optional `reference(task) -> str | None`).
    tokenizer: renders prompts for the length check (the engine's own tokenizer; None
      leaves the check to the engine, which then raises).
    reward_config: the RewardConfig verifications use.
    max_prompt_len: longest prompt the engine admits, tokens.
    episodes: how tasks of episodic domains are played (rlpt.train.generation).
    sleep: how to wait between attempts (tests pass a recorder).
  """

  def __init__(self, settings: SchedulerSettings, engine: RolloutEngine,
               sources: Mapping[str, Any], tokenizer: Any, *,
               reward_config: registry.RewardConfig | None = None, max_prompt_len: int,
               episodes: EpisodeSettings | None = None,
               sleep: Callable[[float], None] = time.sleep):
    self.settings, self.engine, self.sources = settings, engine, dict(sources)
    self.tokenizer, self.reward_config = tokenizer, reward_config
    self.episodes = episodes or EpisodeSettings()
    self.max_prompt_len = int(max_prompt_len)
    self.sleep = sleep
    self._admitted: dict[str, tuple[str, str] | None] = {}  # task key -> (kind, reason)

  # ------------------------------------------------------------------ admission

  def _admit(self, tasks: Sequence[Task]) -> list[tuple[str, str] | None]:
    """Per task: None (admitted) or (FAILURES kind, reason). Cached per task."""
    keys = [task_key(t) for t in tasks]
    new = {k: t for k, t in zip(keys, tasks) if k not in self._admitted}
    refs: list[tuple[str, Task, str]] = []
    for k, t in new.items():
      length = (prompt_length(t, self.tokenizer, self.episodes)
                if self.tokenizer is not None else 0)  # no tokenizer: the engine's own check
      if length > self.max_prompt_len:
        self._admitted[k] = ("prompt_too_long",
                             f"prompt of {length} tokens > rollout.max_prompt_len = "
                             f"{self.max_prompt_len}")
        continue
      self._admitted[k] = None
      ref_fn = getattr(self.sources.get(t.domain), "reference", None)
      if self.settings.check_references and ref_fn is not None:
        ref = ref_fn(t)
        if isinstance(ref, str):
          refs.append((k, t, ref))
    if refs:
      results = self._verify_with_retries([t for _, t, _ in refs], [r for _, _, r in refs],
                                          what="reference check")
      for (k, _, _), res in zip(refs, results):
        failure = registry.verifier_failure(res)
        if failure is not None or res.score < 1.0:
          self._admitted[k] = ("reference_fails",
                               f"the reference completion scored {res.score:g}"
                               + (f" (verifier failed: {failure})" if failure else "")
                               + f", violations {list(res.violations)}")
    return [self._admitted[k] for k in keys]

  # ------------------------------------------------------------------ retries

  def _backoff(self, attempt: int) -> None:
    self.sleep(self.settings.backoff_s * 2 ** (attempt - 1))

  def _retrying(self, fn: Callable[[], Any], what: str, on_failure=None) -> Any:
    """fn() with transient failures retried up to max_attempts (see FAILURES)."""
    for attempt in range(1, self.settings.max_attempts + 1):
      try:
        return fn()
      except Exception as e:  # noqa: BLE001 -- classified below; the rest re-raised
        kind = classify_exception(e)
        if kind is None or failure_class(kind) != TRANSIENT:
          raise
        if on_failure is not None:
          on_failure(kind, attempt, f"{kind}: {type(e).__name__}: {e}")
        if attempt == self.settings.max_attempts:
          raise SchedulerError(f"{what} failed {attempt} times ({kind}); last: "
                               f"{type(e).__name__}: {e}") from e
        logging.warning("%s failed (%s, attempt %d of %d): %s; retrying", what, kind, attempt,
                        self.settings.max_attempts, e)
        self._backoff(attempt)
    raise AssertionError("unreachable")

  def _verify_with_retries(self, tasks, completions, *, what: str, on_failure=None):
    return self._retrying(
        lambda: registry.compute_rewards(tasks, completions, config=self.reward_config),
        what, on_failure)

  # ------------------------------------------------------------------ a round

  def run(self, tasks: Sequence[Task], seeds: Sequence[int], *, n: int,
          sampling: SamplingParams, first_group: int,
          generating: Callable[[], Any] = contextlib.nullcontext) -> Round:
    """Admits, generates and verifies one round; group g of `tasks` gets id
    first_group + g. `generating()` is a context manager entered around each
    engine.generate call (the async collector's busy accounting). Raises
    SchedulerError when a transient failure persists."""
    counts: collections.Counter = collections.Counter()
    dead: list[DeadLetter] = []
    retried: list[tuple[Rollout, str]] = []
    version = int(getattr(self.engine, "weight_version", 0))
    verdicts = self._admit(tasks)
    live = [g for g, v in enumerate(verdicts) if v is None]
    for g, v in enumerate(verdicts):
      if v is not None:
        counts[v[0]] += 1
        dead.append(DeadLetter(tasks[g], first_group + g, v[0], v[1],
                               [placeholder(tasks[g], first_group + g, version, "not_generated")]))
    if not live:
      return Round([], dead, retried, counts=counts)
    live_tasks = [tasks[g] for g in live]

    def generation_failed(kind, attempt, error):  # recorded: one row per group
      counts[kind] += 1
      for g in live:
        r = placeholder(tasks[g], first_group + g, version, "not_generated")
        r.attempt = attempt
        retried.append((r, error))

    def generate():
      with generating():
        return generation.generate(self.engine, live_tasks, n=n, sampling=sampling,
                                   seeds=[seeds[g] for g in live], episodes=self.episodes,
                                   tokenizer=self.tokenizer)

    t0 = time.perf_counter()
    rollouts = self._retrying(generate, "generation", generation_failed)
    t_gen = time.perf_counter() - t0
    failed_generations = counts["engine_unavailable"] + counts["sandbox_lost"]
    for j, r in enumerate(rollouts):
      r.group_id = first_group + live[j // n]
      r.attempt += failed_generations
    t0 = time.perf_counter()
    bad = self._verify(rollouts, retried, counts)
    t_ver = time.perf_counter() - t0
    groups = []
    for i, g in enumerate(live):
      members = rollouts[i * n:(i + 1) * n]
      why = [bad[j] for j in range(i * n, (i + 1) * n) if j in bad]
      if why:
        dead.append(DeadLetter(tasks[g], first_group + g, "verifier_raised_twice", why[0],
                               members))
      else:
        groups.append((first_group + g, members))
    return Round(groups, dead, retried, seconds_generate=t_gen, seconds_verify=t_ver,
                 counts=counts)

  def _verify(self, rollouts: list[Rollout], retried: list, counts: collections.Counter
              ) -> dict[int, str]:
    """Fills every rollout's reward; returns {index: reason} of the completions whose
    verifier raised twice (their groups are dead-lettered; their reward stays None)."""

    def verify(subset: list[int], what: str):
      """Results for `subset`; each failed attempt is recorded, and the attempt numbers
      of the subset's rollouts move past them."""
      def unavailable(kind, attempt, error):
        counts[kind] += 1
        for i in subset:
          retried.append((_copy(rollouts[i]), error))
          rollouts[i].attempt += 1
      rs = [rollouts[i] for i in subset]
      verdicts = self._verify_with_retries([r.task for r in rs], [r.scored_text for r in rs],
                                           what=what, on_failure=unavailable)
      return generation.finish(rs, verdicts, self.episodes, self.reward_config)

    everyone = list(range(len(rollouts)))
    for i, res in zip(everyone, verify(everyone, "verification")):
      rollouts[i].reward = res
    failed = [i for i in everyone if registry.verifier_failure(rollouts[i].reward) is not None]
    if not failed:
      return {}
    counts["verifier_raised"] += len(failed)
    for i in failed:  # the failed attempt is recorded; the completion is verified again
      retried.append((_copy(rollouts[i]),
                      f"verifier_raised: {registry.verifier_failure(rollouts[i].reward)}"))
      rollouts[i].attempt += 1
    self._backoff(1)
    bad = {}
    for i, res in zip(failed, verify(failed, "verification (retry)")):
      failure = registry.verifier_failure(res)
      if failure is None:
        rollouts[i].reward = res
      else:
        counts["verifier_raised_twice"] += 1
        rollouts[i].reward = None
        bad[i] = failure
    return bad
