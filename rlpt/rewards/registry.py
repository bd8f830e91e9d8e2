"""The domain -> verifier registry, penalties, and `compute_reward` (one and batched).

A verifier turns (task, completion) into a score in [0, 1] plus the names of the
rules the completion broke; `compute_reward` turns that into
`reward = score - sum(penalty[v] for v in violations)` with penalties from a
`RewardConfig`. Adding a domain means registering a verifier here and a task
source in `rlpt.data.sources`; nothing else changes.

Verifiers say how they must be isolated:
  * "process": the verifier parses untrusted text in Python (sympy, reasoning-gym
    scorers); it runs in a killable worker process (`workers.WorkerPool`) with a
    per-call timeout, so a pathological input costs at most `timeout_s`.
  * "inline": the verifier already runs the untrusted part elsewhere (the gVisor
    sandbox, with its own limits) and only waits; it runs on a thread. One that has
    not answered after 2x its budget raises VerifierUnavailable (what it waits on
    stalled: infrastructure, not the completion's timeout).

Verification is dispatched by the capacity of what it runs on, not a fixed
concurrency: process-isolated calls go to the worker pool's free processes, and an
inline verifier whose backend has a capacity (`Verifier.capacity`: the sandboxed
verifiers answer with the sandbox pool's warm containers) runs only when one of its
slots is free, counted across every `compute_rewards` call in the process (the async
loop verifies several rounds at once). More at once would only queue behind cold
container boots on the same cores; the 2x stall budget starts when a slot is taken.

A verifier that raises (or whose worker process dies) is reported as score 0 with the
violation "error" and `details["verifier_failure"]` (`verifier_failure(result)`): that
result is no verdict on the completion, and the RL step never trains on it
(rlpt.train.scheduler verifies again, then dead-letters the group).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import difflib
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from rlpt.rewards import workers
from rlpt.types import RewardResult, Task

# The violation names verifiers report (a verifier may add its own; unknown names
# cost `RewardConfig.default_penalty`).
VIOLATIONS = ("format", "timeout", "sandbox", "resource", "error")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How verdicts become rewards.

  Attributes:
    penalties: violation name -> penalty subtracted from the score (each distinct
      violation counted once). "format": no parsable / several different answers or
      malformed JSON; "timeout": the verifier or the sandboxed program ran out of time; "sandbox":
      the program tampered with the harness (early exit, forged or missing test
      records, touching the tests) or the sandbox could not run it; "resource":
      out of memory or output; "error": the verifier itself failed.
    default_penalty: penalty of a violation name absent from `penalties`.
    timeout_s: wall budget of one process-isolated verification (seconds); a
      verifier's own `timeout_s`, when set, wins.
  """

  penalties: Mapping[str, float] = dataclasses.field(default_factory=lambda: {
      "format": 0.0, "timeout": 0.0, "sandbox": 0.5,
      "resource": 0.25, "error": 0.0})
  default_penalty: float = 0.0
  timeout_s: float = 10.0

  def penalty(self, violations: Sequence[str]) -> float:
    return float(sum(self.penalties.get(v, self.default_penalty) for v in dict.fromkeys(violations)))


class VerifierUnavailable(RuntimeError):
  """The verification could not be done (the sandbox could not run, a service is down):
  an infrastructure failure. `compute_rewards` raises it instead of scoring: no such
  failure ever becomes a wrong answer."""


class Verifier:
  """Base class: subclasses implement `verify(task, completion) -> RewardResult`.

  `verify` returns the score in [0, 1], the violations and details; `reward` is
  filled in by `compute_reward`. Instances must pickle when `isolation` is
  "process" (they are shipped to the worker with each call).
  """

  isolation: str = "process"
  timeout_s: float | None = None
  # Whether verify() reads task.prompt; if not, process-isolated calls ship the
  # task without it (an extraction prompt is up to ~400 kB of report).
  needs_prompt: bool = True

  def verify(self, task: Task, completion: str) -> RewardResult:
    raise NotImplementedError

  def prepare(self, task: Task) -> None:
    """Per-task work `verify` needs that is not the completion's to pay for (inline
    verifiers: `compute_rewards` runs it for each task of a batch before any verify
    starts, outside the per-sample budget). Default: nothing."""

  def capacity(self) -> tuple[Any, int] | None:
    """(backend key, n) for an inline verifier whose work runs on a shared backend
    of bounded capacity: at most n verifications with that key run at once in this
    process (the rest wait for a slot). None (the default): no bound of its own."""
    return None


class _Slots:
  """n slots of one verification backend, shared by every thread of the process."""

  def __init__(self, key: Any, n: int):
    self.key, self.n = key, n
    self._sem = threading.BoundedSemaphore(max(1, int(n)))
    self._lock = threading.Lock()
    self._held: set[object] = set()
    self._moved = time.monotonic()   # the last time a slot was taken or given back

  @contextlib.contextmanager
  def hold(self, stall_s: float):
    """Holds a slot (yields its token); raises VerifierUnavailable when every slot
    stays taken, none taken or given back, for `stall_s` seconds (the holders stalled:
    each finishes within its own budget when the backend works)."""
    while not self._sem.acquire(timeout=0.25):
      if time.monotonic() - self._moved > stall_s:
        raise VerifierUnavailable(
            f"no slot of verification backend {self.key!r} ({self.n} at once) was freed "
            f"within {stall_s:.3g} s: the runs holding them stalled")
    token = object()
    with self._lock:
      self._held.add(token)
      self._moved = time.monotonic()
    try:
      yield token
    finally:
      self.give_back(token)

  def give_back(self, token: object) -> None:
    """Frees `token`'s slot once (also for a holder that stalled: its thread may never
    return, and the backend must not lose the slot for good)."""
    with self._lock:
      if token not in self._held:
        return
      self._held.discard(token)
      self._moved = time.monotonic()
    self._sem.release()


_SLOTS: dict[Any, _Slots] = {}
_SLOTS_LOCK = threading.Lock()


@contextlib.contextmanager
def _slot(verifier: Verifier, stall_s: float):
  """Holds one of `verifier`'s backend slots; yields a function that frees it, or
  None for a verifier without a backend capacity."""
  cap = verifier.capacity()
  if cap is None:
    yield None
    return
  key, n = cap
  with _SLOTS_LOCK:
    if key not in _SLOTS or _SLOTS[key].n != n:
      _SLOTS[key] = _Slots(key, n)
    slots = _SLOTS[key]
  with slots.hold(stall_s) as token:
    yield lambda: slots.give_back(token)


class FunctionVerifier(Verifier):
  """Wraps `fn(task, completion) -> RewardResult | float` as a verifier."""

  def __init__(self, fn: Callable[[Task, str], Any], isolation: str = "inline",
               timeout_s: float | None = None):
    self.fn, self.isolation, self.timeout_s = fn, isolation, timeout_s

  def verify(self, task: Task, completion: str) -> RewardResult:
    out = self.fn(task, completion)
    return out if isinstance(out, RewardResult) else RewardResult(score=float(out))


VERIFIER_REGISTRY: dict[str, Verifier] = {}
_FAMILIES: dict[str, Verifier] = {}  # prefix -> verifier of "prefix/..." domains
_CONFIG = RewardConfig()
_REG_LOCK = threading.Lock()


def _as_verifier(domain: str, verifier: Verifier | Callable[[Task, str], Any]) -> Verifier:
  """`verifier` checked (a plain callable becomes an inline FunctionVerifier)."""
  if not isinstance(domain, str) or not domain:
    raise ValueError(f"register: domain must be a non-empty string, got {domain!r}")
  if not isinstance(verifier, Verifier):
    if not callable(verifier):
      raise TypeError(f"register({domain!r}): verifier must be a Verifier or a callable "
                      f"(task, completion) -> RewardResult | float, got {type(verifier).__name__}")
    verifier = FunctionVerifier(verifier)
  if verifier.isolation not in ("process", "inline"):
    raise ValueError(f"register({domain!r}): isolation must be 'process' or 'inline', "
                     f"got {verifier.isolation!r}")
  return verifier


def register(domain: str, verifier: Verifier | Callable[[Task, str], Any], *,
             replace: bool = True) -> Verifier:
  """Binds `domain` to `verifier` (a `Verifier` or a plain callable, run inline)."""
  verifier = _as_verifier(domain, verifier)
  with _REG_LOCK:
    if not replace and domain in VERIFIER_REGISTRY:
      raise KeyError(f"register: domain {domain!r} already has a verifier")
    VERIFIER_REGISTRY[domain] = verifier
  return verifier


def configure(config: RewardConfig) -> None:
  """Sets the process-wide default `RewardConfig`."""
  global _CONFIG
  _CONFIG = config


def get_config() -> RewardConfig:
  return _CONFIG


def register_family(prefix: str, verifier: Verifier | Callable[[Task, str], Any]) -> Verifier:
  """Binds every domain "<prefix>/<anything>" without its own verifier to `verifier`
  (e.g. "synthetic/copy+sum"); the bare "<prefix>" is a domain of its own."""
  verifier = _as_verifier(prefix, verifier)
  with _REG_LOCK:
    _FAMILIES[prefix] = verifier
  return verifier


def has_verifier(domain: str) -> bool:
  """Whether `domain` has a verifier (its own, or its family's)."""
  return domain in VERIFIER_REGISTRY or ("/" in domain and domain.partition("/")[0] in _FAMILIES)


def get_verifier(domain: str) -> Verifier:
  try:
    return VERIFIER_REGISTRY[domain]
  except KeyError:
    family = _FAMILIES.get(domain.partition("/")[0]) if "/" in domain else None
    if family is not None:
      return family
    close = difflib.get_close_matches(domain, list(VERIFIER_REGISTRY), n=3)
    raise KeyError(f"no verifier registered for task domain {domain!r}"
                   + (f"; did you mean {close}?" if close else
                      f" ({len(VERIFIER_REGISTRY)} domains registered)")) from None


def _shipped(verifier: Verifier, task: Task) -> Task:
  """The task as sent to a worker process: without the prompt unless the verifier reads it."""
  if getattr(verifier, "needs_prompt", True) or not task.prompt:
    return task
  return dataclasses.replace(task, prompt="")


def _run_verifier(verifier: Verifier, task: Task, completion: str) -> RewardResult:
  return verifier.verify(task, completion)


def _finish(verdict: RewardResult, config: RewardConfig) -> RewardResult:
  """Clips the score to [0, 1] and prices the violations. (A completion's length is
  the RL step's business: DAPO's overlong shaping in rlpt.train.collector.)"""
  score = min(1.0, max(0.0, float(verdict.score)))
  violations = tuple(dict.fromkeys(verdict.violations))
  return RewardResult(score=score, violations=violations,
                      reward=score - config.penalty(violations), details=dict(verdict.details))


# details key set when the verifier itself failed (raised, or its worker process died):
# the score 0 / violation "error" then says nothing about the completion, and the RL
# step's scheduler (rlpt.train.scheduler) never trains on it: it verifies again, then
# dead-letters the group.
FAILURE_KEY = "verifier_failure"


def verifier_failure(result: RewardResult | None) -> str | None:
  """The error text when `result` records a failure of the verifier itself (not a
  verdict on the completion); None for a real verdict."""
  if result is None:
    return "unverified"
  return result.details.get(FAILURE_KEY)


def _failed(error: str) -> RewardResult:
  return RewardResult(0.0, ("error",), details={"error": error, FAILURE_KEY: error})


def _from_outcome(outcome: workers.Outcome) -> RewardResult:
  if outcome.status == "ok":
    v = outcome.value
    return v if isinstance(v, RewardResult) else RewardResult(score=float(v))
  if outcome.status == "timeout":
    return RewardResult(0.0, ("timeout",), details={"error": outcome.error})
  return _failed(outcome.error)


def _run_inline(verifier: Verifier, task: Task, completion: str,
                starts: dict | None = None, key: int = 0, stall_s: float = 20.0,
                abandoned: threading.Event | None = None) -> RewardResult:
  with _slot(verifier, stall_s) as free:
    if abandoned is not None and abandoned.is_set():
      # Its batch already raised (a stalled holder freed this slot): nobody reads the
      # result, so the slot goes straight back instead of running a verification.
      raise VerifierUnavailable("the batch was abandoned before this verification started")
    if starts is not None:  # the stall budget runs from here, not from queueing
      starts[key] = (time.monotonic(), free)
    try:
      return verifier.verify(task, completion)
    except VerifierUnavailable:
      raise  # infrastructure: never a score
    except Exception as e:  # noqa: BLE001 -- a verifier bug is reported, it does not kill the batch
      return _failed(f"{type(e).__name__}: {e}")


def _prepare(verifier: Verifier, task: Task, stall_s: float) -> None:
  with _slot(verifier, stall_s):
    verifier.prepare(task)


def compute_reward(task: Task, completion: str, *, config: RewardConfig | None = None
                   ) -> RewardResult:
  """Verifies one completion of `task` with its domain's verifier; see module doc."""
  return compute_rewards([task], [completion], config=config)[0]


def compute_rewards(tasks: Sequence[Task], completions: Sequence[str], *,
                    config: RewardConfig | None = None, pool: workers.WorkerPool | None = None,
                    max_inline_workers: int = 16) -> list[RewardResult]:
  """Verifies a batch in parallel, each sample under its own timeout.

  Process-isolated samples are spread over the worker pool (`pool`, default the
  process-wide one); inline ones (sandboxed programs) run on up to
  `max_inline_workers` threads, each waiting for a slot of its verifier's backend
  (`Verifier.capacity`). Returns results in input order.
  """
  if len(tasks) != len(completions):
    raise ValueError(f"compute_rewards: {len(tasks)} tasks but {len(completions)} completions")
  config = config or _CONFIG
  for i, c in enumerate(completions):
    if not isinstance(c, str):
      raise TypeError(f"compute_rewards: completion {i} is {type(c).__name__}, expected str")
  verifiers = [get_verifier(t.domain) for t in tasks]
  results: list[RewardResult | None] = [None] * len(tasks)
  inline = [i for i, v in enumerate(verifiers) if v.isolation == "inline"]
  isolated = [i for i, v in enumerate(verifiers) if v.isolation == "process"]
  executor = None
  futures, starts = {}, {}
  abandoned = threading.Event()
  if inline:
    executor = concurrent.futures.ThreadPoolExecutor(min(max_inline_workers, len(inline)))
    # Per-task preparation first (e.g. the code verifier's null-implementation runs),
    # once per (verifier, task), so no completion's budget pays for it.
    prep = {}
    for i in inline:
      prep.setdefault((id(verifiers[i]), id(tasks[i])), (verifiers[i], tasks[i]))
    budgets = {i: 2 * (verifiers[i].timeout_s or config.timeout_s) for i in inline}
    try:
      for f in [executor.submit(_prepare, v, t, 2 * (v.timeout_s or config.timeout_s))
                for v, t in prep.values()]:
        f.result()
    except BaseException:
      executor.shutdown(wait=False, cancel_futures=True)
      raise
    futures = {i: executor.submit(_run_inline, verifiers[i], tasks[i], completions[i], starts, i,
                                  budgets[i], abandoned) for i in inline}
  try:
    if isolated:
      pool = pool or workers.default_pool()
      try:
        outcomes = pool.map(
            [(_run_verifier, (verifiers[i], _shipped(verifiers[i], tasks[i]), completions[i]))
             for i in isolated],
            [verifiers[i].timeout_s or config.timeout_s for i in isolated])
      except workers.PoolUnavailable as e:  # infrastructure: raised, never scored
        raise VerifierUnavailable(f"the verifier worker pool cannot run: {e}") from e
      for i, o in zip(isolated, outcomes):
        results[i] = _from_outcome(o)
    # An inline verifier only waits on something that enforces its own limits (the
    # sandbox stops a program at timeout_s and says so): one silent past 2x its budget
    # means that machinery stalled (a sandbox pool that cannot boot, a hung service),
    # which is infrastructure, never the completion's timeout.
    # Every started one is checked, not only the one waited on: one waiting for a
    # backend slot cannot start while the slot's holder is the one stalled.
    for i, f in futures.items():
      while results[i] is None:
        try:
          results[i] = f.result(timeout=0.25)
        except concurrent.futures.TimeoutError:
          now = time.monotonic()
          for j, (t0, _) in list(starts.items()):
            if not futures[j].done() and now - t0 > budgets[j]:
              abandoned.set()   # before any slot is freed: no waiting item may take it
              for k, (_, free) in list(starts.items()):   # stuck holders free their slots
                if free is not None and not futures[k].done():
                  free()
              raise VerifierUnavailable(
                  f"the inline verifier of domain {tasks[j].domain!r} did not answer within "
                  f"{budgets[j]:.3g} s (2x its budget; what it waits on enforces its own "
                  f"limits): the verifier or its sandbox stalled") from None
  except BaseException:
    abandoned.set()
    raise
  finally:
    if executor is not None:  # after a raise, queued verifications never start
      executor.shutdown(wait=False, cancel_futures=True)
  return [_finish(r, config) for r in results]  # type: ignore[arg-type]
