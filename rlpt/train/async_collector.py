"""The asynchronous collector of `rl.mode = "async"`: generation runs on the rollout
fleet into a bounded buffer of finished groups while the learner trains.

    collector = AsyncCollector(settings, mixer, fleet, pad_id=pad_id, key=key)
    collector.start()
    batch = collector.collect(learner.version)   # a RolloutBatch, as Collector.collect
    ...                                          # learner.update(batch); weight sync
    collector.stop()

Producers: `rl.async_rounds` threads, each in a loop: reserve room for one round of
`prompts_per_step` (G) groups, draw the round's tasks from the mixer and its per-prompt seeds
from the collector's key (both under `lock`), generate on the engine, verify, shape
the rewards (rlpt.train.collector's functions, as in sync mode) and append the
round's groups to the buffer. A group's weight version is the oldest version among
its completions; the fleet finishes a request on the weights it started with, or
aborts and reruns it on the new ones (`rl.inflight`), so every completion comes from
one version.

A round starts only when it can be trained in time (the staleness gate): with u
groups finished or in flight ahead of it, its last group is the (u + G - 1)-th to
leave the buffer from now; `collects_ahead` says how many collects after the one in
progress (or the next one, at version L) take it, from the groups that collect has
kept and consumed and the fraction of consumed groups a collect keeps. That fraction
is 1 without dynamic sampling (every fresh group trains: the last group is taken at
L + (k + u + G - 1) // G, k the groups kept so far) and with `rl.gate_keep = "all"`;
with "observed" it is the highest kept / taken ratio of the last KEEP_WINDOW collects
(1 before the first): a step that drops most groups for want of reward variance
consumes several rounds, and counting every group as a trained one holds generation
to about one round ahead of the learner; the highest recent ratio errs towards a
later collect, so towards starting too few rounds rather than generating groups the
filter would drop as stale. "all" is the default because on one shared CPU host
running further ahead slowed the learner as much as it fed it (configs/common.py).
The round is sampled by the engine's current version e, so it starts while
L + ahead - e <= max_staleness (the engine may lag the learner: weight syncs are
staged), while its first group would still be taken by a step of the run (no round
is drawn for after the last step; reckoned with the lowest recent kept / taken
ratio, or the refill budget before the first collect, so this rule errs towards
drawing a round the last step may need), and while the buffer has room (`rl.buffer_groups`: by default two
batches, less than a step consumes with dynamic sampling; configs/common.py says
why). Generation therefore runs no further ahead than the staleness filter below
allows, instead of producing groups it would drop.

Consumer (`collect`, on the learner's thread): takes groups oldest first. A group
more than `rl.max_staleness` versions behind the learner is dropped as stale (kept
in `batch.stale`, recorded with outcome "stale", never trained); with dynamic
sampling a group without reward variance is filtered as in sync mode. It stops at
`prompts_per_step` trained groups, or, with dynamic sampling, once it has consumed
the sync loop's budget ((max_refill_rounds + 1) x prompts_per_step x oversample
groups), training what it has.

Rounds run through the round scheduler (rlpt.train.scheduler): transient failures are
retried there; dead-lettered groups leave the mixer and reach the next batch's
records (`batch.dead`), as do failed attempts (`batch.retried`), and the producer
replaces them at once with a round of as many new prompts (up to REPLACEMENT_ROUNDS
times), whose groups enter the buffer together with the round's: a round still
delivers prompts_per_step groups, so batches stay aligned with rounds.

Counts close at every step (`counts()`): generated = trained + filtered + stale +
dead_letter + buffered, in groups. Group ids are unique over the run (generation order). A
producer's failure (a fleet that cannot generate, a verifier pool that died) stops
the producers and is raised by the next `collect`: never scored, never skipped.
Callers that touch the mixer while producers run (update, get_state) hold `lock`.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import pickle
import threading
import time
from typing import Callable

import jax
import numpy as np

from rlpt.data.mixer import DomainMixer
from rlpt.rollout.engine import RolloutEngine
from rlpt.train.batch import RolloutBatch, pack_rows
from rlpt.train.collector import make_scheduler, round_outputs, step_seeds
from rlpt.train.scheduler import Scheduler
from rlpt.train.settings import Settings
from rlpt.types import Rollout


COUNTS = ("generated", "trained", "filtered", "stale", "dead_letter")
# Collects whose kept / taken ratio the staleness gate looks back on.
KEEP_WINDOW = 3
# Replacement rounds a producer runs for a round's dead-lettered groups.
REPLACEMENT_ROUNDS = 3


def collects_ahead(position: int, *, kept: int, consumed: int, prompts_per_step: int,
                   budget: int, keep: float) -> int:
  """How many collects after the current one take the group at `position` (0 = the
  next group to leave the buffer), the current one being the collect in progress (it
  has `kept` groups and `consumed` groups towards `budget` so far) or, between
  collects, the next one (kept = consumed = 0). A collect takes groups until it keeps
  prompts_per_step or has consumed `budget`; `keep` is the fraction of taken groups it
  keeps, in (0, 1]."""
  G = prompts_per_step
  keep = min(max(keep, 1e-3), 1.0)
  left = min((G - kept) / keep, budget - consumed)   # the current collect's remaining take
  if position < left:
    return 0
  return 1 + int((position - left) // min(G / keep, budget))


class ProducerError(RuntimeError):
  """Generation or verification failed in a producer thread (the cause is chained)."""


@dataclasses.dataclass
class Group:
  """One prompt's n verified rollouts, as the buffer holds them.

  rewards: float32[n], shaped; version: the oldest weight version among the
  completions; seconds_generate / seconds_verify: this group's share of its round's
  wall time."""

  rollouts: list[Rollout]
  rewards: np.ndarray
  version: int
  seconds_generate: float
  seconds_verify: float


class AsyncCollector:
  """Producer threads filling a bounded buffer, and the learner's `collect`; see the
  module docstring."""

  def __init__(self, settings: Settings, mixer: DomainMixer, engine: RolloutEngine, *,
               pad_id: int, key: jax.Array, learner_version: int = 0,
               scheduler: Scheduler | None = None):
    self.settings, self.mixer, self.engine = settings, mixer, engine
    self.scheduler = scheduler or make_scheduler(settings, mixer, engine)
    self.pad_id = int(pad_id)
    self.sampling = settings.rollout.sampling()
    self.key = key
    self.capacity = settings.rl.buffer_groups
    self.lock = threading.Lock()              # the mixer, the key and every counter
    self._cond = threading.Condition(self.lock)
    self._buffer: collections.deque[Group] = collections.deque()
    self._reserved = 0                        # groups of rounds in flight
    self._next_group = 0
    self._pending: dict[int, tuple[list, np.ndarray]] = {}  # first group id -> round
    self._replay: list[tuple[int, list, np.ndarray]] = []  # restored rounds to run first
    self._counts = collections.Counter()
    self._retried: list = []                  # (rollout, error) not yet in a batch
    self._dead: list = []                     # (rollout, reason) not yet in a batch
    self._error: BaseException | None = None
    self._stopping = False
    self._threads: list[threading.Thread] = []
    self._generating = 0                      # rounds inside engine.generate now
    self._busy_s = 0.0
    self._busy_since = 0.0
    self._t_start = 0.0
    self._last_wait = 0.0
    self._learner_next = int(learner_version)  # the version of the learner's next collect
    self._taken = 0                           # groups the collect in progress has kept
    self._consumed = 0                        # ... and taken towards its budget (not stale)
    self._budget = settings.rl.collect_budget(settings.data.prompts_per_step)
    self._keeps: collections.deque[float] = collections.deque(maxlen=KEEP_WINDOW)
    self._restored = 0                        # finished groups taken back from a checkpoint
    self._replayed = 0                        # groups of in-flight rounds run again

  # ------------------------------------------------------------------ producers

  def start(self) -> None:
    self._t_start = time.perf_counter()
    for i in range(self.settings.rl.async_rounds):
      t = threading.Thread(target=self._produce, name=f"rlpt-producer-{i}", daemon=True)
      t.start()
      self._threads.append(t)

  def _produce(self) -> None:
    G = self.settings.data.prompts_per_step
    try:
      while True:
        with self._cond:
          while (not self._stopping and self._error is None and not self._may_start()):
            self._cond.wait(timeout=0.2)  # the engine's version moves without a notify
          if self._stopping or self._error is not None:
            return
          if self._replay:   # a round that was in flight at the restored checkpoint
            first, tasks, seeds = self._replay.pop(0)
          else:
            first, tasks, seeds = self._draw(G)
          self._reserved += len(tasks)
          self._pending[first] = (tasks, seeds)
        rounds = [(first, self._run(tasks, seeds, first))]
        # Dead-lettered groups are replaced by new prompts (as the sync collector does),
        # so a round still delivers its share of a batch and batches stay aligned with
        # rounds (the staleness gate's accounting); each replacement round is in flight
        # (and checkpointed) on its own.
        for _ in range(REPLACEMENT_ROUNDS):
          missing = len(rounds[-1][1].dead)
          if not missing:
            break
          with self._cond:
            if self._stopping or self._error is not None:
              break
            for d in rounds[-1][1].dead:
              self.mixer.exclude(d.task)
            r_first, r_tasks, r_seeds = self._draw(missing)
            self._pending[r_first] = (r_tasks, r_seeds)
          rounds.append((r_first, self._run(r_tasks, r_seeds, r_first)))
        self._finish(rounds, reserved=len(tasks))
    except BaseException as e:  # noqa: BLE001 -- handed to the learner's thread
      with self._cond:
        if self._error is None:
          self._error = e
        self._cond.notify_all()

  def _draw(self, count: int) -> tuple[int, list, np.ndarray]:
    """(first group id, tasks, seeds) of `count` new prompts (lock held)."""
    tasks = self.mixer.sample(count)
    self.key, seeds = step_seeds(self.key, count)
    first = self._next_group
    self._next_group += count
    return first, tasks, seeds

  def _run(self, tasks, seeds, first: int):
    return self.scheduler.run(tasks, seeds, n=self.settings.rollout.n, sampling=self.sampling,
                              first_group=first, generating=self._generating_span)

  def _finish(self, rounds: list, *, reserved: int) -> None:
    """Moves a round's (and its replacements') groups into the buffer at once, and its
    records and counts into the collector."""
    n = self.settings.rollout.n
    groups, retried, dead = [], [], []
    for _, rnd in rounds:
      rollouts, rewards, rt, dd = round_outputs(rnd, self.settings.rl.overlong)
      share_g = rnd.seconds_generate / max(len(rnd.groups) + len(rnd.dead), 1)
      share_v = rnd.seconds_verify / max(len(rnd.groups) + len(rnd.dead), 1)
      groups += [Group(rollouts[k * n:(k + 1) * n], rewards[k * n:(k + 1) * n],
                       min(r.weight_version for r in rollouts[k * n:(k + 1) * n]),
                       share_g, share_v) for k in range(len(rnd.groups))]
      retried += rt
      dead += dd
    with self._cond:
      for first, rnd in rounds:
        for d in rnd.dead:
          self.mixer.exclude(d.task)
        del self._pending[first]
        self._counts["generated"] += len(rnd.groups) + len(rnd.dead)
        self._counts["dead_letter"] += len(rnd.dead)
      self._reserved -= reserved
      self._buffer.extend(groups)
      self._retried += retried
      self._dead += dead
      self._cond.notify_all()

  @contextlib.contextmanager
  def _generating_span(self):
    """Around each engine.generate call: the engine's busy time is the union of these."""
    with self._cond:
      self._generating += 1
      if self._generating == 1:
        self._busy_since = time.perf_counter()
    try:
      yield
    finally:
      with self._cond:
        self._generating -= 1
        if self._generating == 0:
          self._busy_s += time.perf_counter() - self._busy_since

  def _may_start(self) -> bool:
    """The staleness gate, the run's end and the buffer bound for one more round
    (lock held; see the module docstring)."""
    s = self.settings
    G = s.data.prompts_per_step
    ahead = len(self._buffer) + self._reserved
    if ahead + G > self.capacity:
      return False
    keep = max(self._keeps) if self._keeps and s.rl.gate_keep == "observed" else 1.0
    # the run's end errs the other way: a step may consume more than the gate reckons
    keep_end = min(self._keeps) if self._keeps else G / self._budget

    def version(position: int, keep: float) -> int:  # of the collect that takes that group
      return self._learner_next + collects_ahead(
          position, kept=self._taken, consumed=self._consumed, prompts_per_step=G,
          budget=self._budget, keep=keep)

    # the last step's collect runs at version total_steps - 1
    return (version(ahead, keep_end) <= s.total_steps - 1
            and version(ahead + G - 1, keep) - int(self.engine.weight_version)
            <= s.rl.max_staleness)

  def request_stop(self) -> None:
    """No new rounds from now on (rounds in flight finish into the buffer)."""
    with self._cond:
      self._stopping = True
      self._cond.notify_all()

  def stop(self, timeout_s: float = 600.0) -> None:
    """`request_stop`, then waits for the rounds in flight to finish (their groups
    stay in the buffer, counted as buffered)."""
    self.request_stop()
    deadline = time.monotonic() + timeout_s
    for t in self._threads:
      t.join(max(0.0, deadline - time.monotonic()))

  # ------------------------------------------------------------------ consumer

  def _take(self, classify: Callable[[Group], str]) -> tuple[Group, str]:
    """The oldest finished group and what the batch does with it, `classify(g)`:
    "kept", "filtered" or "stale" (blocks while there is none). A kept group is
    counted in `_taken`, and a kept or filtered one in `_consumed`, in the same
    instant it leaves the buffer, so the staleness gate always finds it in one of
    the two."""
    with self._cond:
      while not self._buffer and self._error is None:
        if self._stopping or not self._threads:
          raise RuntimeError("AsyncCollector.collect: the producers are not running")
        self._cond.wait()
      if self._error is not None:
        raise ProducerError(f"rollout generation failed: {self._error!r}") from self._error
      g = self._buffer.popleft()
      kind = classify(g)
      self._taken += kind == "kept"
      self._consumed += kind != "stale"
      self._cond.notify_all()   # room for another round
      return g, kind

  def collect(self, learner_version: int) -> RolloutBatch:
    """The next batch for a learner at `learner_version` (see the module docstring).
    Blocks while the buffer is empty; raises ProducerError when a producer failed."""
    s = self.settings
    G, n = s.data.prompts_per_step, s.rollout.n
    oldest = int(learner_version) - s.rl.max_staleness
    kept: list[Group] = []        # trained groups first, then filtered ones
    filtered: list[Group] = []
    stale: list[Group] = []
    t0 = time.perf_counter()
    with self._cond:
      self._learner_next = int(learner_version)
      self._cond.notify_all()
    try:
      def classify(g: Group) -> str:
        if g.version < oldest:
          return "stale"
        if s.rl.dynamic_sampling and float(np.ptp(g.rewards)) == 0.0:
          return "filtered"
        return "kept"

      lists = {"kept": kept, "filtered": filtered, "stale": stale}
      while len(kept) < G and len(kept) + len(filtered) < self._budget:  # stale: free
        g, kind = self._take(classify)
        lists[kind].append(g)
    finally:
      with self._cond:
        self._learner_next = int(learner_version) + 1  # it trains this batch next
        self._taken = self._consumed = 0
        taken = len(kept) + len(filtered) + len(stale)
        if taken:
          self._keeps.append(len(kept) / taken)
    waited = time.perf_counter() - t0
    with self.lock:
      self._counts["trained"] += len(kept)
      self._counts["filtered"] += len(filtered)
      self._counts["stale"] += len(stale)
      self._last_wait = waited
      retried, self._retried = self._retried, []
      dead, self._dead = self._dead, []
    every = [r for g in kept + filtered for r in g.rollouts]
    shaped = (np.concatenate([g.rewards for g in kept + filtered]).astype(np.float32)
              if every else np.zeros((0,), np.float32))
    trained = np.arange(len(kept) * n, dtype=np.int64)
    shaped.setflags(write=False)
    trained.setflags(write=False)
    rows = pack_rows(every[:len(trained)], shaped[:len(trained)], pad_id=self.pad_id,
                     length_multiple=s.rl.length_multiple, rows=s.learner_rows(len(trained)))
    used = kept + filtered
    return RolloutBatch(rollouts=tuple(every), rewards=shaped, trained=trained, rows=rows,
                        group_size=n, dropped_groups=len(filtered),
                        seconds_generate=sum(g.seconds_generate for g in used),
                        seconds_verify=sum(g.seconds_verify for g in used),
                        stale=tuple(r for g in stale for r in g.rollouts),
                        retried=tuple(retried), dead=tuple(dead))

  # ------------------------------------------------------------------ checkpoints

  def snapshot(self) -> tuple[jax.Array, dict, str]:
    """(key, mixer state, buffer state) at one instant, for a checkpoint: the
    buffer state (base64 pickle, exact) holds the finished untrained groups and the
    rounds in flight (their tasks and seeds; they run again on resume, first, since a
    request cannot be resumed mid-generation), so a resume trains every group that was
    drawn exactly once and draws nothing twice."""
    with self.lock:
      state = {"buffer": list(self._buffer),
               "in_flight": [(f, *self._pending[f]) for f in sorted(self._pending)],
               "next_group": self._next_group,
               "retried": list(self._retried), "dead": list(self._dead),
               "counts": {k: int(self._counts[k]) for k in COUNTS},
               "keeps": list(self._keeps)}
      state["in_flight"] += list(self._replay)  # restored rounds not yet started
      return self.key, self.mixer.get_state(), base64.b64encode(pickle.dumps(state)).decode()

  def restore(self, state: str) -> None:
    """Takes back a `snapshot`'s buffer state (before `start`); the key and the
    mixer are restored by the caller."""
    st = pickle.loads(base64.b64decode(state))
    with self.lock:
      self._buffer = collections.deque(st["buffer"])
      self._replay = [tuple(r) for r in st["in_flight"]]
      self._next_group = int(st["next_group"])
      self._counts.update(st["counts"])  # the counts go on from the checkpoint's
      self._retried = list(st.get("retried", ()))
      self._dead = list(st.get("dead", ()))
      self._keeps.extend(st.get("keeps", ()))   # the gate's view of recent steps
      self._restored = len(self._buffer)
      self._replayed = sum(len(tasks) for _, tasks, _ in self._replay)

  # ------------------------------------------------------------------ observability

  def counts(self) -> dict[str, int]:
    """Groups so far in the run (carried over a resume): generated (drawn into a
    round), trained, filtered, stale, dead_letter (rlpt.train.scheduler), buffered
    (finished, not yet taken) and in_flight (rounds being generated or verified).
    generated = trained + filtered + stale + dead_letter + buffered."""
    with self.lock:
      c = {k: int(self._counts[k]) for k in COUNTS}
      c["buffered"] = len(self._buffer)
      c["in_flight"] = self._reserved
    return c

  def engine_seconds(self) -> tuple[float, float]:
    """(seconds with at least one round inside engine.generate, wall seconds) since
    `start`."""
    with self.lock:
      now = time.perf_counter()
      busy = self._busy_s + (now - self._busy_since if self._generating else 0.0)
    return busy, now - self._t_start

  def metrics(self) -> dict[str, float]:
    """The step's async fields for metrics.jsonl (counts are cumulative)."""
    out = {f"async/{k}_groups": float(v) for k, v in self.counts().items()}
    out["async/buffer_capacity"] = float(self.capacity)
    out["async/restored_groups"] = float(self._restored)
    out["async/replayed_groups"] = float(self._replayed)
    busy, wall = self.engine_seconds()
    out["async/engine_busy"] = busy / max(wall, 1e-9)
    out["async/engine_busy_s"] = busy      # cumulative, for busy fractions over a window
    out["async/wall_s"] = wall
    out["time/wait_s"] = self._last_wait
    return out
