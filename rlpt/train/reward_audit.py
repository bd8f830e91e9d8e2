"""Reward integrity: does any verifier pay for a degenerate completion, and what does
the best constant answer get?

    rows = audit(["math", "rg/gcd"], n=4)    # one DomainAudit per domain
    base = constant_baseline(source, holdout_tasks)

For each domain, `audit` samples train and holdout tasks and scores, through the
registry (the same verifiers and pools as training):
  (a) the reference completion (`source.reference(task)`), which must score 1;
  (b) a battery of degenerate completions: empty; the answer format with nothing
      inside; the prompt echoed (bare and inside the format); several answers in
      several tags, the right one among them (hedging); every candidate listed in one
      answer, the right one among them; for code, stub bodies (pass / return None /
      True / False / 0 / "" / []) and an empty block; for geometry, scripts that write
      an empty mesh or a default box;
  (c) the best constant: the most frequent reference answer over `n_train` train tasks,
      in the answer format, scored on the holdout tasks (its hit rate).
A degenerate completion that earns reward is a verifier flaw, unless it is literally
the task's right answer in its format (e.g. a task whose answer is empty). Constants
are a property of the task distribution, not a flaw: their hit rate is reported so
that holdout accuracy reads against what a constant gets.

A domain whose source has no reference completion (rg/boxnet) is listed as unaudited,
with the reason.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from rlpt.types import Task

NULL_BODIES = ("pass", "return None", "return True", "return False", "return 0", "return ''",
               "return []")


@dataclasses.dataclass
class DomainAudit:
  """What `audit` found for one domain (see the module docstring)."""

  domain: str
  reference_min: float = float("inf")       # lowest reference score over the sampled tasks
  worst_degenerate: str = ""                # the degenerate completion kind with most reward
  worst_degenerate_reward: float = 0.0
  worst_degenerate_text: str = ""
  flaws: list[tuple[str, str, float]] = dataclasses.field(default_factory=list)
  constant: str = ""                        # the best constant answer (train split)
  constant_hit_rate: float = float("nan")   # its accuracy on the holdout tasks
  unaudited: str = ""                       # why the domain could not be audited

  @property
  def ok(self) -> bool:
    return not self.unaudited and self.reference_min >= 1.0 and not self.flaws


def answer_of(task: Task) -> str | None:
  """The task's reference answer as a string (what a constant answer repeats)."""
  entry = task.metadata.get("rg_entry")
  if entry is not None:
    from rlpt.data.sources.rg_tasks import reference_answer
    return reference_answer(entry)
  if task.domain == "extraction":
    return json.dumps(task.answer, sort_keys=True)
  if task.domain in ("code", "geometry"):
    return None  # programs, not constants
  return None if task.answer is None else str(task.answer)


def answer_template(reference: str) -> str | None:
  """The answer format of a domain, from one reference completion: '<answer>{}</answer>',
  '\\boxed{{{}}}' or a ```json block; None for program domains."""
  if "<answer>" in reference:
    return "<answer>{}</answer>"
  if "\\boxed{" in reference:
    return "\\boxed{{{}}}"
  if reference.lstrip().startswith("```json"):
    return "```json\n{}\n```"
  return None


def degenerate_completions(task: Task, reference: str, others: Sequence[str]) -> dict[str, str]:
  """Named degenerate completions of `task` (`others`: other tasks' answers, wrong here)."""
  out = {"empty": "", "prompt_echo": task.prompt}
  if task.domain == "code" or task.metadata.get("entry_point"):
    stub = task.metadata.get("test_prelude", "")
    for body in NULL_BODIES:
      out[f"stub:{body}"] = "```python\n" + stub + "    " + body + "\n```"
    out["empty_block"] = "```python\n```"
    return out
  if task.domain == "geometry":
    for name, mesh in (("empty_mesh", "trimesh.Trimesh()"), ("default_box", "trimesh.creation.box()"),
                       ("unit_sphere", "trimesh.creation.icosphere()")):
      out[name] = f"```python\nimport trimesh\nmesh = {mesh}\nmesh.export('out.stl')\n```"
    out["empty_block"] = "```python\n```"
    return out
  tpl = answer_template(reference)
  if tpl is None:
    return out
  gold = answer_of(task)
  wrong = [w for w in dict.fromkeys(others) if w != gold][:3]
  out["empty_format"] = tpl.format("")
  out["prompt_in_format"] = tpl.format(task.prompt)
  if gold is not None and wrong:
    out["hedge_tags"] = "\n".join(tpl.format(a) for a in [wrong[0], gold] + wrong[1:])
    out["all_candidates"] = tpl.format(", ".join(wrong[:1] + [gold] + wrong[1:]))
  return out


def _legit(task: Task, reference: str, completion: str) -> bool:
  """The completion is the task's right answer itself, in the answer format."""
  gold = answer_of(task)
  tpl = answer_template(reference)
  return gold is not None and tpl is not None and completion == tpl.format(gold)


def constant_baseline(source: Any, holdout: Sequence[Task], *, n_train: int = 64,
                      reward_config: Any = None) -> tuple[str, float]:
  """(the most frequent reference answer over the first `n_train` train tasks, its
  accuracy on `holdout`): what always answering one constant gets."""
  from rlpt.rewards import compute_rewards
  reference = getattr(source, "reference", None)
  train = [source.train(i) for i in range(n_train)]
  answers = [answer_of(t) for t in train]
  counted = collections.Counter(a for a in answers if a is not None)
  refs = [reference(t) for t in train] if reference is not None else []
  if not holdout or not counted or not any(refs):
    return "", float("nan")
  constant = counted.most_common(1)[0][0]
  tpl = answer_template(next(r for r in refs if r))
  if tpl is None:
    return "", float("nan")
  from rlpt.rewards.registry import verifier_failure
  results = compute_rewards(list(holdout), [tpl.format(constant)] * len(holdout),
                            config=reward_config)
  scored = [r.score >= 1.0 for r in results if verifier_failure(r) is None]  # never score a failure
  return constant, float(np.mean(scored)) if scored else float("nan")


def audit(domains: Sequence[str], *, n: int = 4, n_constant: int = 64, seed: int = 0,
          reward_config: Any = None) -> list[DomainAudit]:
  """Audits every domain in `domains` (see the module docstring): `n` train and `n`
  holdout tasks each for (a) and (b), `n_constant` train tasks and 4n holdout tasks
  for (c). All completions go to the verifiers as one batch."""
  from rlpt.data import sources
  from rlpt.rewards import compute_rewards
  rows, jobs = [], []          # jobs: (row, kind, task, completion, reference)
  for d in domains:
    row = DomainAudit(d)
    rows.append(row)
    src = sources.get_source(d, seed=seed)
    tasks = [src.train(i) for i in range(n)] + src.holdout(n)
    refs = [src.reference(t) for t in tasks]
    if any(r is None for r in refs):
      row.unaudited = "the task source has no reference completion for its tasks"
      continue
    others = [a for a in (answer_of(src.train(n + i)) for i in range(8)) if a is not None]
    for t, ref in zip(tasks, refs):
      jobs.append((row, "reference", t, ref, ref))
      for kind, comp in degenerate_completions(t, ref, others).items():
        jobs.append((row, kind, t, comp, ref))
  # Sandboxed verifiers (code, geometry) run as many at once as there are cores: more
  # would share the CPU and time out programs that are right (trimesh alone imports
  # for ~2 s), which the audit would then report as failing references.
  results = compute_rewards([j[2] for j in jobs], [j[3] for j in jobs], config=reward_config,
                            max_inline_workers=max(1, os.cpu_count() or 1))
  for (row, kind, task, comp, ref), r in zip(jobs, results):
    if kind == "reference":
      row.reference_min = min(row.reference_min, r.score)
      continue
    if r.reward > row.worst_degenerate_reward or not row.worst_degenerate:
      row.worst_degenerate, row.worst_degenerate_reward = kind, r.reward
      row.worst_degenerate_text = comp[:120]
    if r.score > 0 and not _legit(task, ref, comp):
      row.flaws.append((kind, comp[:200], r.score))
  for row in rows:
    if row.unaudited:
      continue
    src = sources.get_source(row.domain, seed=seed)
    row.constant, row.constant_hit_rate = constant_baseline(
        src, src.holdout(4 * n), n_train=n_constant, reward_config=reward_config)
  return rows
