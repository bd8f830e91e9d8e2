"""The domain mixer: which tasks an RL step trains on.

    mixer = DomainMixer({"math": src_a, "rg/chain_sum": src_b},
                        weights={"math": 2.0, "rg/chain_sum": 1.0}, seed=0,
                        curriculum=Curriculum(kind="learnability"))
    tasks = mixer.sample(8)                       # list[Task]
    mixer.update({"math": [0.0, 1.0, ...]})       # per-domain scores of the step
    state = mixer.get_state()                     # JSON dict for the checkpoint
    mixer.set_state(state)                        # exact resume

A task source is anything with `train(index) -> Task` (deterministic in the
index) and `holdout(n) -> list[Task]`; the mixer keeps one cursor per domain and
draws domains with a seeded numpy Generator, so the sequence of tasks is a pure
function of (seed, sources, weights, the scores fed to `update`), and
get_state()/set_state() restore it exactly. Tasks the RL step dead-letters
(rlpt.train.scheduler) are excluded by content (`exclude`) and skipped from then on;
the exclusion list is part of the state.

Curriculum (optional): the mixer keeps an exponential moving average of each
domain's score in [0, 1]. With kind="learnability" a domain's weight is scaled by
max(floor, 4 p (1 - p)), p the average, once the domain has `min_samples`
observations: domains the policy always solves (p ~ 1) or never solves (p ~ 0)
give group-relative methods no signal and are drawn less; kind="none" keeps the
configured ratios.

Coverage (optional, `cover_first`): until every domain with a positive weight has
been drawn once, draws go to the domains not drawn yet (in a seeded random order), so
a mix of hundreds of domains sees each of them in its first steps and the curriculum
gets an estimate for every domain before it reweights; then draws follow the
probabilities.

Forgetting guard (optional, `forgetting_margin` > 0): `observe_holdout` takes each
evaluated domain's holdout accuracy and remembers its best; a domain whose latest
accuracy is more than the margin below its best is flagged and its weight multiplied
by `forgetting_boost` until an evaluation brings it back within the margin.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from rlpt.types import Task, task_key

# Consecutive excluded tasks `sample` skips in one domain before it gives up.
MAX_SKIPS = 10_000


class TaskSource(Protocol):
  def train(self, index: int) -> Task: ...

  def holdout(self, n: int) -> list[Task]: ...


CURRICULA = ("none", "learnability")


@dataclasses.dataclass(frozen=True)
class Curriculum:
  """How per-domain statistics change the mix.

  Attributes:
    kind: "none" (fixed ratios) or "learnability" (see module doc).
    ema: weight of the newest step in the moving average of a domain's score.
    floor: smallest scale a domain's weight can get (keeps every domain alive).
    min_samples: observations of a domain before its weight changes.
    forgetting_margin: holdout accuracy (fraction) a domain may fall below its best
      before it is flagged as forgetting; 0 = no guard.
    forgetting_boost: the weight factor of a flagged domain.
    cover_first: draw every domain with a positive weight once before any twice.
  """

  kind: str = "none"
  ema: float = 0.3
  floor: float = 0.1
  min_samples: int = 8
  forgetting_margin: float = 0.0
  forgetting_boost: float = 2.0
  cover_first: bool = False

  def __post_init__(self):
    if self.kind not in CURRICULA:
      raise ValueError(f"curriculum.kind must be one of {CURRICULA}, got {self.kind!r}")
    if not 0.0 < self.ema <= 1.0:
      raise ValueError(f"curriculum.ema must be in (0, 1], got {self.ema}")
    if not 0.0 < self.floor <= 1.0:
      raise ValueError(f"curriculum.floor must be in (0, 1], got {self.floor}")
    if not 0.0 <= self.forgetting_margin < 1.0:
      raise ValueError(f"forgetting_margin must be in [0, 1), got {self.forgetting_margin}")
    if not self.forgetting_boost >= 1.0:
      raise ValueError(f"forgetting_boost must be >= 1, got {self.forgetting_boost}")


class DomainMixer:
  """Seeded, resumable sampling of tasks across domains (see module doc)."""

  def __init__(self, sources: Mapping[str, TaskSource], weights: Mapping[str, float],
               *, seed: int = 0, curriculum: Curriculum | None = None):
    unknown = sorted(set(weights) - set(sources))
    if unknown:
      raise ValueError(f"mixer weights name domains without a task source: {unknown}; "
                       f"sources: {sorted(sources)}")
    if not weights:
      raise ValueError("mixer needs at least one domain with a weight")
    for d, w in weights.items():
      if not (isinstance(w, (int, float)) and np.isfinite(w) and w >= 0):
        raise ValueError(f"mixer weight of domain {d!r} must be a finite number >= 0, got {w!r}")
    if sum(weights.values()) <= 0:
      raise ValueError(f"mixer weights must not all be 0: {dict(weights)}")
    self.domains = sorted(weights)
    self.sources = {d: sources[d] for d in self.domains}
    self.base = np.array([float(weights[d]) for d in self.domains])
    self.curriculum = curriculum or Curriculum()
    self.seed = int(seed)
    self._rng = np.random.default_rng(self.seed)
    self._cursor = {d: 0 for d in self.domains}
    self._avg = {d: 0.0 for d in self.domains}
    self._count = {d: 0 for d in self.domains}
    self._excluded: set[str] = set()  # task keys never drawn again (dead letters)
    self._best: dict[str, float] = {}  # best holdout accuracy seen per domain
    self._flagged: set[str] = set()    # domains forgetting (the guard)

  def probabilities(self) -> dict[str, float]:
    """Current sampling probability of each domain."""
    w = self.base.copy()
    if self.curriculum.kind == "learnability":
      for i, d in enumerate(self.domains):
        if self._count[d] >= self.curriculum.min_samples:
          p = self._avg[d]
          w[i] *= max(self.curriculum.floor, 4.0 * p * (1.0 - p))
    for i, d in enumerate(self.domains):
      if d in self._flagged:
        w[i] *= self.curriculum.forgetting_boost
    return dict(zip(self.domains, (w / w.sum()).tolist()))

  def observe_holdout(self, accuracies: Mapping[str, float]) -> list[str]:
    """Feeds evaluated domains' holdout accuracies to the forgetting guard; returns
    the domains flagged now (their latest accuracy is more than the margin below their
    best). Domains not in `accuracies` keep their state."""
    margin = self.curriculum.forgetting_margin
    for d, acc in accuracies.items():
      if d not in self._cursor or not np.isfinite(acc):
        continue
      self._best[d] = max(self._best.get(d, float(acc)), float(acc))
      if margin > 0 and self._best[d] - float(acc) > margin:
        self._flagged.add(d)
      else:
        self._flagged.discard(d)
    return sorted(self._flagged)

  @property
  def forgetting(self) -> list[str]:
    """The domains the guard flags now."""
    return sorted(self._flagged)

  def sample(self, n: int) -> list[Task]:
    """The next `n` training tasks (skipping excluded ones)."""
    p = np.array(list(self.probabilities().values()))
    picks = list(self._rng.choice(len(self.domains), size=n, p=p))
    if self.curriculum.cover_first:
      unseen = [i for i, d in enumerate(self.domains) if self._cursor[d] == 0 and self.base[i] > 0]
      first = self._rng.permutation(unseen)[:n].tolist() if unseen else []
      picks = first + picks[:n - len(first)]
    out = []
    for i in picks:
      d = self.domains[int(i)]
      for _ in range(MAX_SKIPS + 1):
        task = self.sources[d].train(self._cursor[d])
        self._cursor[d] += 1
        if not self._excluded or task_key(task) not in self._excluded:
          break
      else:
        raise RuntimeError(f"domain {d!r}: {MAX_SKIPS + 1} tasks in a row are excluded "
                           f"(dead-lettered); its task source is exhausted")
      out.append(task)
    return out

  def exclude(self, task: Task) -> None:
    """Never draw `task` (by content: rlpt.types.task_key) again."""
    self._excluded.add(task_key(task))

  def holdout(self, n_per_domain: int) -> dict[str, list[Task]]:
    """Each domain's first `n_per_domain` holdout tasks."""
    return {d: self.sources[d].holdout(n_per_domain) for d in self.domains}

  def update(self, scores: Mapping[str, Iterable[float]]) -> None:
    """Feeds one step's scores (in [0, 1]) per domain into the moving averages."""
    for d, xs in scores.items():
      if d not in self._avg:
        continue
      xs = [float(x) for x in xs]
      if not xs:
        continue
      m = float(np.clip(np.mean(xs), 0.0, 1.0))
      a = self.curriculum.ema if self._count[d] else 1.0
      self._avg[d] = (1 - a) * self._avg[d] + a * m
      self._count[d] += len(xs)

  def stats(self) -> dict[str, dict[str, float]]:
    """Per domain: moving-average score, observations, tasks drawn, probability."""
    probs = self.probabilities()
    return {d: {"score_avg": self._avg[d], "count": self._count[d],
                "drawn": self._cursor[d], "prob": probs[d],
                "forgetting": float(d in self._flagged)} for d in self.domains}

  def get_state(self) -> dict[str, Any]:
    """Everything needed to continue the exact same task sequence (JSON-able)."""
    return {"seed": self.seed, "domains": list(self.domains),
            "rng": self._rng.bit_generator.state, "cursor": dict(self._cursor),
            "avg": dict(self._avg), "count": dict(self._count),
            "excluded": sorted(self._excluded), "best_holdout": dict(self._best),
            "forgetting": sorted(self._flagged)}

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores `get_state()`'s output; the domain set must be the same."""
    if sorted(state.get("domains", [])) != self.domains:
      raise ValueError(f"mixer state is for domains {state.get('domains')}, "
                       f"this mixer has {self.domains}")
    rng = np.random.default_rng()
    rng.bit_generator.state = copy.deepcopy(dict(state["rng"]))
    self._rng = rng
    self.seed = int(state["seed"])
    self._cursor = {d: int(state["cursor"][d]) for d in self.domains}
    self._avg = {d: float(state["avg"][d]) for d in self.domains}
    self._count = {d: int(state["count"][d]) for d in self.domains}
    self._excluded = set(state.get("excluded", ()))
    self._best = {d: float(v) for d, v in state.get("best_holdout", {}).items()}
    self._flagged = set(state.get("forgetting", ()))


def domain_scores(domains: Sequence[str], scores: Sequence[float]) -> dict[str, list[float]]:
  """Groups per-sample scores by domain (the argument `update` takes)."""
  out: dict[str, list[float]] = {}
  for d, s in zip(domains, scores):
    out.setdefault(d, []).append(float(s))
  return out
