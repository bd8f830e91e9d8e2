r"""A discrete-event simulation of the RL pipeline (rollout fleet, verifiers, learner,
weight sync), sync or async, for planning cluster shapes without the cluster.

    costs = fit_costs(profile)                        # from a run's own metrics
    res = simulate(Pipeline(mode="async", prompts_per_step=4, n=4, max_staleness=2),
                   Shape(members=8, learner_speedup=8.0), costs, profile.groups,
                   steps=6, warmup=2, seed=0)
    res.traj_per_s, res.engine_busy, res.learner_busy, res.staleness_hist

Every time is in seconds, every length in tokens. Pure Python + numpy (no JAX).

The model follows the real loop (rlpt.train.rl_loop, async_collector, weight_sync,
rlpt.rollout.server and fleet):
  * a round is `prompts_per_step` (G) groups of `n` samples; each group is one request
    routed to the member with the fewest outstanding tokens (n x (prompt +
    max_new_tokens)); a member runs its queued requests (up to `max_batch_prompts`) as
    one batch that lasts until its longest sample ends:
    `gen_base_s + gen_per_token_s x longest`; a weight load is queued like work and runs
    between batches (`load_s`).
  * verification of a round: `verify_base_s + sum over samples of verify_per_sample_s
    [domain]`, on one of `verifier_workers` slots.
  * learner: `overhead_s` bookkeeping per step plus
    `(train_base_s + train_per_token_s x tokens) / learner_speedup`, tokens the trained
    rows' prompt + completion tokens.
  * sync mode: generate, verify, train, then publish (`publish_s`) and every member
    loads (`load_s`), the learner waiting for all of it.
  * async mode: `async_rounds` producers; a round starts only while L + ahead // G -
    engine_version <= max_staleness (the collector's gate without dynamic sampling,
    which the simulation does not model) and the buffer has room (ahead: groups buffered or
    in flight; L: the version of the learner's next collect); the learner takes groups
    oldest first, drops those more than max_staleness versions old, trains G; its sync
    blocks for `host_copy_s` (after waiting while `max_behind` syncs are unfinished), and
    one background thread publishes and has every member load each version in order.
  * `host_slowdown` (a shared host, e.g. this machine's two cores): while k > 1 pieces
    of work (member batches and loads, verifications, learner updates, publishes, host
    copies, bookkeeping) run at once, each progresses at 1 / (1 + (F - 1) x (k - 1)) of
    its solo speed, F its kind's entry in `slowdown_by_kind` (KINDS: "gen" a member's
    batch, "load", "verify", "train" the learner's update, "publish", "copy" the async
    host copy, "other" bookkeeping) or `host_slowdown` for kinds not there. The kinds
    need not share one F: on two cores the learner's XLA threads take most of both, and
    a member's decode beside it slows more than the learner does. 1.0 everywhere:
    separate devices, nothing slows anything.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from typing import Any, Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class GroupSample:
  """One prompt's group as a run generated it: domain, prompt tokens, and the n
  completion lengths (tokens)."""

  domain: str
  prompt_len: int
  lengths: tuple[int, ...]


@dataclasses.dataclass
class Costs:
  """The per-component cost model (seconds; see the module docstring)."""

  gen_base_s: float
  gen_per_token_s: float
  verify_base_s: float
  verify_per_sample_s: dict[str, float]
  train_base_s: float
  train_per_token_s: float
  publish_s: float
  load_s: float
  host_copy_s: float
  overhead_s: float
  host_slowdown: float = 1.0
  slowdown_by_kind: dict[str, float] = dataclasses.field(default_factory=dict)

  def slowdown(self, kind: str) -> float:
    return float(self.slowdown_by_kind.get(kind, self.host_slowdown))


KINDS = ("gen", "load", "verify", "train", "publish", "copy", "other")


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """The run's loop settings (config.json's data/rollout/rl fields)."""

  mode: str = "async"
  prompts_per_step: int = 4
  n: int = 4
  max_staleness: int = 2
  async_rounds: int = 2
  buffer_groups: int = 0          # 0 = 2 x prompts_per_step (rl.buffer_groups without
                                  # dynamic sampling)
  max_new_tokens: int = 512
  max_behind: int = 2             # WeightSync.max_behind
  max_batch_prompts: int = 0      # a member's batch; 0 = prompts_per_step (fleet_engine)


@dataclasses.dataclass(frozen=True)
class Shape:
  """The cluster: rollout members, learner speed relative to the measured one, and
  verification slots (None: one per producer)."""

  members: int = 1
  learner_speedup: float = 1.0
  verifier_workers: int | None = None


@dataclasses.dataclass
class Result:
  """Figures over the steps after the warm-up, as launch.bench async computes them."""

  traj_per_s: float
  engine_busy: float        # time with a round inside generate / wall (sync: rollout / step)
  member_busy: float        # mean fraction of wall each member spends in batches or loads
  learner_busy: float       # (train + blocking sync) / wall
  staleness_hist: dict[int, int]   # trained groups by versions behind the learner
  step_s: list[float]
  train_s: float            # mean learner update seconds (slowed on a shared host)
  wall_s: float
  trained: int
  stale_groups: int


# ----------------------------------------------------------------------------- engine


class _Event:
  """A one-shot event processes can wait on (`yield ev`)."""

  def __init__(self, sim: "_Sim"):
    self.sim, self.done, self.value, self.waiters = sim, False, None, []

  def succeed(self, value: Any = None) -> None:
    if not self.done:
      self.done, self.value = True, value
      for p in self.waiters:
        self.sim.schedule(0.0, p, value)
      self.waiters = []


@dataclasses.dataclass
class _Work:
  """Host-shared work of one of KINDS: `seconds` at solo speed (slowed while others
  run, see Costs)."""

  seconds: float
  kind: str = "other"


class _Sim:
  """A small process-oriented event loop: processes are generators yielding _Work
  (resumed when it is done) or an _Event (resumed when it fires)."""

  def __init__(self, slowdown: Callable[[str], float] = lambda kind: 1.0):
    self.now, self.heap, self.seq = 0.0, [], itertools.count()
    self.jobs: list[list] = []        # [remaining solo seconds, process, slowdown F]
    self.slowdown = slowdown
    self.finish: dict[Any, _Event] = {}   # started process -> its done event

  def event(self) -> _Event:
    return _Event(self)

  def schedule(self, delay: float, proc, value: Any = None) -> None:
    heapq.heappush(self.heap, (self.now + delay, next(self.seq), proc, value))

  def start(self, gen) -> _Event:
    done = self.event()
    self.finish[gen] = done
    self.schedule(0.0, gen)
    return done

  def _rates(self) -> list[float]:
    others = max(len(self.jobs) - 1, 0)
    return [1.0 / (1.0 + (j[2] - 1.0) * others) for j in self.jobs]

  def _resume(self, proc, value: Any) -> None:
    try:
      cmd = proc.send(value)
    except StopIteration as stop:
      done = self.finish.pop(proc, None)
      if done is not None:
        done.succeed(stop.value)
      return
    if isinstance(cmd, _Work):
      if cmd.kind not in KINDS:
        raise ValueError(f"work kind {cmd.kind!r} is not one of {KINDS}")
      self.jobs.append([max(cmd.seconds, 0.0), proc, self.slowdown(cmd.kind)])
    elif isinstance(cmd, _Event):
      if cmd.done:
        self.schedule(0.0, proc, cmd.value)
      else:
        cmd.waiters.append(proc)
    else:
      raise TypeError(f"a simulated process yielded {cmd!r}")

  def run(self, until: _Event) -> None:
    while not until.done:
      rates = self._rates()
      t_job = (self.now + min(j[0] / r for j, r in zip(self.jobs, rates))
               if self.jobs else float("inf"))
      t_ev = self.heap[0][0] if self.heap else float("inf")
      if t_job == t_ev == float("inf"):
        raise RuntimeError("pipeline simulation deadlocked (nothing left to happen)")
      t = min(t_job, t_ev)
      for j, r in zip(self.jobs, rates):
        j[0] -= (t - self.now) * r
      self.now = t
      if t_job <= t_ev:
        finished = [j for j in self.jobs if j[0] <= 1e-9]
        self.jobs = [j for j in self.jobs if j[0] > 1e-9]
        for j in finished:
          self._resume(j[1], None)
      else:
        _, _, proc, value = heapq.heappop(self.heap)
        self._resume(proc, value)


class _Signal:
  """A condition variable: `yield sig.wait()`; `notify()` wakes every waiter."""

  def __init__(self, sim: _Sim):
    self.sim, self.ev = sim, sim.event()

  def wait(self) -> _Event:
    return self.ev

  def notify(self) -> None:
    ev, self.ev = self.ev, self.sim.event()
    ev.succeed()


class _Busy:
  """The union of intervals with at least one holder (engine busy time)."""

  def __init__(self, sim: _Sim):
    self.sim, self.count, self.since, self.spans = sim, 0, 0.0, []

  def enter(self) -> None:
    self.count += 1
    if self.count == 1:
      self.since = self.sim.now

  def leave(self) -> None:
    self.count -= 1
    if self.count == 0:
      self.spans.append((self.since, self.sim.now))

  def within(self, t0: float, t1: float) -> float:
    spans = self.spans + ([(self.since, self.sim.now)] if self.count else [])
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)


# ----------------------------------------------------------------------------- pipeline


class _Member:
  """One rollout server: a FIFO of generation requests and weight loads."""

  def __init__(self, sim: _Sim, costs: Costs, max_prompts: int):
    self.sim, self.costs, self.max_prompts = sim, costs, max_prompts
    self.queue: collections.deque = collections.deque()
    self.signal = _Signal(sim)
    self.version, self.outstanding = 0, 0
    self.busy = _Busy(sim)
    sim.start(self._loop())

  def submit(self, item: tuple) -> _Event:
    ev = self.sim.event()
    self.queue.append(item + (ev,))
    self.signal.notify()
    return ev

  def _loop(self):
    c = self.costs
    while True:
      while not self.queue:
        yield self.signal.wait()
      item = self.queue.popleft()
      self.busy.enter()
      if item[0] == "load":
        yield _Work(c.load_s, "load")
        self.version = item[1]
        self.busy.leave()
        item[-1].succeed()
        continue
      batch = [item]
      while self.queue and self.queue[0][0] == "gen" and len(batch) < self.max_prompts:
        batch.append(self.queue.popleft())
      version = self.version
      longest = max(max(g.lengths) for _, g, _ in batch)
      yield _Work(c.gen_base_s + c.gen_per_token_s * longest, "gen")
      self.busy.leave()
      for _, g, ev in batch:
        ev.succeed(version)


class _Run:
  """One simulated run: members, producers or the sync collector, the learner."""

  def __init__(self, p: Pipeline, shape: Shape, costs: Costs, groups: Sequence[GroupSample],
               steps: int, warmup: int, rng: np.random.Generator):
    self.p, self.shape, self.c, self.groups, self.rng = p, shape, costs, groups, rng
    self.steps, self.warmup = steps, warmup
    self.sim = _Sim(costs.slowdown)
    G = p.prompts_per_step
    self.members = [_Member(self.sim, costs, p.max_batch_prompts or G)
                    for _ in range(shape.members)]
    self.engine = _Busy(self.sim)
    self.engine_version = 0
    self.learner_next = 0
    self.buffer: collections.deque = collections.deque()
    self.reserved = 0
    self.capacity = p.buffer_groups or 2 * G
    self.changed = _Signal(self.sim)
    self.stopping = False
    workers = shape.verifier_workers or max(p.async_rounds, 1)
    self.verify_free, self.verify_signal = workers, _Signal(self.sim)
    self.learner_busy_s = 0.0
    self.train_s: list[float] = []
    self.marks: list[float] = []
    self.hist: collections.Counter = collections.Counter()
    self.trained = self.stale = 0
    self.sync_jobs: collections.deque = collections.deque()
    self.sync_signal = _Signal(self.sim)

  # -- a round: generate on the fleet, then verify
  def _round(self):
    p, c = self.p, self.c
    picks = self.rng.integers(0, len(self.groups), size=p.prompts_per_step)
    groups = [self.groups[i] for i in picks]
    self.engine.enter()
    evs = []
    for g in groups:
      m = min(self.members, key=lambda m: m.outstanding)
      cost = p.n * (g.prompt_len + p.max_new_tokens)
      m.outstanding += cost
      evs.append((m, cost, m.submit(("gen", g))))
    versions = []
    for m, cost, ev in evs:
      versions.append((yield ev))
      m.outstanding -= cost
    self.engine.leave()
    while self.verify_free == 0:
      yield self.verify_signal.wait()
    self.verify_free -= 1
    yield _Work(c.verify_base_s + sum(c.verify_per_sample_s.get(g.domain, 0.0) * len(g.lengths)
                                      for g in groups), "verify")
    self.verify_free += 1
    self.verify_signal.notify()
    return list(zip(groups, versions))

  def _may_start(self) -> bool:
    p = self.p
    ahead = len(self.buffer) + self.reserved
    lag = self.learner_next + ahead // p.prompts_per_step - self.engine_version
    return lag <= p.max_staleness and ahead + p.prompts_per_step <= self.capacity

  def _producer(self):
    G = self.p.prompts_per_step
    while True:
      while not self.stopping and not self._may_start():
        yield self.changed.wait()
      if self.stopping:
        return
      self.reserved += G
      done = yield from self._round()
      self.reserved -= G
      self.buffer.extend(done)
      self.changed.notify()

  def _sync_worker(self):
    """The background publisher of async mode: publish, then every member loads."""
    while True:
      while not self.sync_jobs:
        yield self.sync_signal.wait()
      version, ev = self.sync_jobs[0]
      yield _Work(self.c.publish_s, "publish")
      loads = [m.submit(("load", version)) for m in self.members]
      for e in loads:
        yield e
      self.engine_version = version
      self.sync_jobs.popleft()
      ev.succeed()
      self.changed.notify()

  def _train(self, groups: list[tuple[GroupSample, int]]):
    c = self.c
    tokens = sum(len(g.lengths) * g.prompt_len + sum(g.lengths) for g, _ in groups)
    t0 = self.sim.now
    yield _Work((c.train_base_s + c.train_per_token_s * tokens) / self.shape.learner_speedup,
                "train")
    return self.sim.now - t0

  def _learner(self):
    p, c, G = self.p, self.c, self.p.prompts_per_step
    is_async = p.mode == "async"
    staged: collections.deque = collections.deque()
    version = 0
    self.marks.append(self.sim.now)
    for step in range(1, self.steps + self.warmup + 1):
      if is_async:
        self.learner_next = version
        self.changed.notify()
        kept = []
        while len(kept) < G:
          while not self.buffer:
            yield self.changed.wait()
          g, v = self.buffer.popleft()
          self.changed.notify()
          if v < version - p.max_staleness:
            self.stale += step > self.warmup
            continue
          kept.append((g, v))
        self.learner_next = version + 1
        self.changed.notify()
        if step == self.steps + self.warmup:
          self.stopping = True
      else:
        kept = yield from self._round()
      busy = yield from self._train(kept)
      if step > self.warmup:
        self.train_s.append(busy)
      t0 = self.sim.now
      if is_async:
        while len(staged) >= p.max_behind:
          yield staged.popleft()
        yield _Work(c.host_copy_s, "copy")
        ev = self.sim.event()
        staged.append(ev)
        self.sync_jobs.append((step, ev))
        self.sync_signal.notify()
      else:
        yield _Work(c.publish_s, "publish")
        for e in [m.submit(("load", step)) for m in self.members]:
          yield e
        self.engine_version = step
      busy += self.sim.now - t0
      if step > self.warmup:
        self.learner_busy_s += busy
        self.trained += len(kept) * p.n
        self.hist.update(version - v for _, v in kept)
      version = step
      yield _Work(c.overhead_s)
      self.marks.append(self.sim.now)

  def run(self) -> Result:
    sim = self.sim
    if self.p.mode == "async":
      for _ in range(self.p.async_rounds):
        sim.start(self._producer())
      sim.start(self._sync_worker())
    sim.run(sim.start(self._learner()))
    t0, t1 = self.marks[self.warmup], self.marks[-1]
    wall = max(t1 - t0, 1e-12)
    step_s = list(np.diff(self.marks[self.warmup:]))
    return Result(
        traj_per_s=self.trained / wall,
        engine_busy=self.engine.within(t0, t1) / wall,
        member_busy=float(np.mean([m.busy.within(t0, t1) for m in self.members])) / wall,
        learner_busy=self.learner_busy_s / wall,
        staleness_hist=dict(sorted(self.hist.items())), step_s=[float(x) for x in step_s],
        train_s=float(np.mean(self.train_s)), wall_s=wall,
        trained=self.trained, stale_groups=self.stale)


def simulate(p: Pipeline, shape: Shape, costs: Costs, groups: Sequence[GroupSample], *,
             steps: int, warmup: int = 2, seed: int = 0) -> Result:
  """One simulated run of `warmup + steps` learner steps; figures over the last
  `steps` (see Result). Groups are drawn with replacement from `groups`."""
  if p.mode not in ("sync", "async"):
    raise ValueError(f"mode must be 'sync' or 'async', got {p.mode!r}")
  if p.mode == "async" and p.max_staleness < 1:
    raise ValueError("async mode needs max_staleness >= 1 (as rl.mode = 'async')")
  if steps < 1 or warmup < 0 or shape.members < 1 or shape.learner_speedup <= 0:
    raise ValueError("need steps >= 1, warmup >= 0, members >= 1, learner_speedup > 0")
  if not groups:
    raise ValueError("no response-length samples (groups) to draw from")
  return _Run(p, shape, costs, list(groups), steps, warmup, np.random.default_rng(seed)).run()


def simulate_many(p: Pipeline, shape: Shape, costs: Costs, groups: Sequence[GroupSample], *,
                  steps: int, warmup: int = 2, replicas: int = 20, seed: int = 0
                  ) -> dict[str, Any]:
  """`replicas` independent runs: mean, p10 and p90 of each figure, and the summed
  staleness histogram as fractions of trained groups."""
  runs = [simulate(p, shape, costs, groups, steps=steps, warmup=warmup, seed=seed + i)
          for i in range(replicas)]
  out: dict[str, Any] = {}
  for f in ("traj_per_s", "engine_busy", "member_busy", "learner_busy", "wall_s", "train_s"):
    v = np.array([getattr(r, f) for r in runs])
    out[f] = {"mean": float(v.mean()), "p10": float(np.percentile(v, 10)),
              "p90": float(np.percentile(v, 90))}
  v = np.array([np.mean(r.step_s) for r in runs])
  out["step_s"] = {"mean": float(v.mean()), "p10": float(np.percentile(v, 10)),
                   "p90": float(np.percentile(v, 90))}
  hist: collections.Counter = collections.Counter()
  for r in runs:
    hist.update(r.staleness_hist)
  total = max(sum(hist.values()), 1)
  out["staleness"] = {int(k): v / total for k, v in sorted(hist.items())}
  out["stale_groups_per_run"] = float(np.mean([r.stale_groups for r in runs]))
  return out
