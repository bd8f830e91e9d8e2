"""Every trajectory of a run, one Parquet file per RL step.

    store = TrajectoryStore(workdir.trajectories)
    store.discard_after(restored_step)      # on resume: exactly-once
    store.write_step(step, rollouts, advantages=adv)
    table = read_trajectories(workdir.trajectories)   # pyarrow.Table, all steps

Layout: `WORKDIR/trajectories/step_00000012.parquet`. A step's file is written
to a hidden temporary name, fsynced and renamed, so a reader never sees a torn
file and a crash leaves at most a stray temporary (removed on the next open).

Exactly-once across crash/resume: the loop writes step s's file before step s's
checkpoint can exist; on resume from the checkpoint of step k, files of steps
> k are discarded (they belong to steps that will run again), and a step that
runs again replaces its file. So every step in [1, k] has exactly one file and
no trajectory is dropped or counted twice.

Columns (one row per sampled completion, failures included):
  step int64, weight_version int64, group_id int64, sample_index int64,
  domain string, prompt string, answer string (JSON), task_metadata string (JSON),
  prompt_ids list<int32>, completion_ids list<int32>, completion_text string,
  logprobs list<float32>, finish_reason string,
  score float64, reward float64, violations list<string>, reward_details string (JSON),
  advantage float64 (NaN when not given), error string (verifier/infra failure, "" if none),
  outcome string (what the step did with it: "trained", "filtered" by dynamic sampling,
  "stale" past rl.max_staleness in async mode, "retried" (a failed attempt, e.g. a
  verifier that raised, recorded and tried again), "dead_letter" (a group that will
  never train, rlpt.train.scheduler); "" when not given),
  attempt int64 (1 for the first try; rlpt.types.Rollout.attempt),
  token_versions list<int32> (the version that sampled each completion token, for a
  partial rollout that spans versions; empty when every token is weight_version's),
  completion_mask list<bool> (a multi-turn episode: True on the model's tokens,
  False on the environment's; empty for a single-turn rollout, all trained),
  turns string (JSON: an episode's turns, rlpt.types.Rollout.turns; "[]" otherwise),
  verified_text string (an episode's final state, what its verifier scored; null for
  a single-turn rollout, whose completion_text is scored).
Files written before a column existed read back with its empty value.
`episode_transcript(table, i)` prints row i as a conversation.

WORKDIR/dead_letter/ holds the dead-lettered groups in the same layout and schema
(outcome "dead_letter", the reason in `error`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlpt.types import Rollout

SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("weight_version", pa.int64()),
    ("group_id", pa.int64()),
    ("sample_index", pa.int64()),
    ("domain", pa.string()),
    ("prompt", pa.string()),
    ("answer", pa.string()),
    ("task_metadata", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("completion_text", pa.string()),
    ("logprobs", pa.list_(pa.float32())),
    ("finish_reason", pa.string()),
    ("score", pa.float64()),
    ("reward", pa.float64()),
    ("violations", pa.list_(pa.string())),
    ("reward_details", pa.string()),
    ("advantage", pa.float64()),
    ("error", pa.string()),
    ("outcome", pa.string()),
    ("attempt", pa.int64()),
    ("token_versions", pa.list_(pa.int32())),
    ("completion_mask", pa.list_(pa.bool_())),
    ("turns", pa.string()),
    ("verified_text", pa.string()),
])

_FILE_RE = re.compile(r"^step_(\d{8})\.parquet$")


def _json(x: Any) -> str:
  return json.dumps(x, sort_keys=True, default=repr)


def step_file(directory: str, step: int) -> str:
  return os.path.join(directory, f"step_{int(step):08d}.parquet")


def rollouts_to_table(step: int, rollouts: Sequence[Rollout],
                      advantages: Sequence[float] | None = None,
                      errors: Sequence[str] | None = None,
                      outcomes: Sequence[str] | None = None) -> pa.Table:
  """One row per rollout (see the module docstring for the columns)."""
  if advantages is not None and len(advantages) != len(rollouts):
    raise ValueError(f"advantages has {len(advantages)} entries for {len(rollouts)} rollouts")
  if errors is not None and len(errors) != len(rollouts):
    raise ValueError(f"errors has {len(errors)} entries for {len(rollouts)} rollouts")
  if outcomes is not None and len(outcomes) != len(rollouts):
    raise ValueError(f"outcomes has {len(outcomes)} entries for {len(rollouts)} rollouts")
  cols: dict[str, list] = {f.name: [] for f in SCHEMA}
  seen: dict[int, int] = {}
  for i, r in enumerate(rollouts):
    rr = r.reward
    cols["step"].append(int(step))
    cols["weight_version"].append(int(r.weight_version))
    cols["group_id"].append(int(r.group_id))
    cols["sample_index"].append(seen.get(r.group_id, 0))
    seen[r.group_id] = seen.get(r.group_id, 0) + 1
    cols["domain"].append(r.task.domain)
    cols["prompt"].append(r.task.prompt)
    cols["answer"].append(_json(r.task.answer))
    cols["task_metadata"].append(_json(r.task.metadata))
    cols["prompt_ids"].append([int(t) for t in r.prompt_ids])
    cols["completion_ids"].append([int(t) for t in r.completion_ids])
    cols["completion_text"].append(r.completion_text)
    cols["logprobs"].append([float(x) for x in r.logprobs])
    cols["finish_reason"].append(r.finish_reason)
    cols["score"].append(float(rr.score) if rr is not None else float("nan"))
    cols["reward"].append(float(rr.reward) if rr is not None else float("nan"))
    cols["violations"].append(list(rr.violations) if rr is not None else [])
    cols["reward_details"].append(_json(rr.details) if rr is not None else "{}")
    cols["advantage"].append(float(advantages[i]) if advantages is not None else float("nan"))
    err = errors[i] if errors is not None else ""
    if not err and rr is None:
      err = "unverified"
    cols["error"].append(err)
    cols["outcome"].append(outcomes[i] if outcomes is not None else "")
    cols["attempt"].append(int(r.attempt))
    cols["token_versions"].append([int(v) for v in r.token_versions or ()])
    cols["completion_mask"].append([bool(m) for m in r.completion_mask or ()])
    cols["turns"].append(_json(r.turns or []))
    cols["verified_text"].append(r.verified_text)
  return pa.Table.from_pydict(cols, schema=SCHEMA)


_EMPTY = {"completion_mask": [], "turns": "[]", "token_versions": [], "verified_text": None}


def _conform(table: pa.Table, wanted: Sequence[str]) -> pa.Table:
  """The `wanted` columns of a table read from a file, in that order; those added
  to the schema after an older file was written are filled with their empty value."""
  for name in wanted:
    if name not in table.column_names and name in _EMPTY:
      f = SCHEMA.field(name)
      table = table.append_column(f, pa.array([_EMPTY[name]] * table.num_rows, f.type))
  return table.select(list(wanted))


def episode_transcript(table: pa.Table, index: int) -> str:
  """Row `index` of a trajectory table as a readable conversation: the prompt, then
  per turn the model's text, each tool call with its output, exit status and
  violation; then the verdict. A single-turn row shows its one completion."""
  row = {k: v[0] for k, v in table.slice(index, 1).to_pydict().items()}
  turns = json.loads(row.get("turns") or "[]")
  lines = [f"[{row['domain']}] step {row['step']} group {row['group_id']} sample "
           f"{row['sample_index']}", f"user: {row['prompt']}"]
  if not turns:
    lines.append(f"assistant: {row['completion_text']}")
  for k, t in enumerate(turns, start=1):
    lines.append(f"assistant (turn {k}, {t['finish_reason']}): {t['text']}")
    if t.get("truncated"):
      lines.append(f"  [episode cut: {t['truncated']}]")
    for c in t["tools"]:
      status = "" if c["exit_code"] is None else f", exit {c['exit_code']}"
      bad = f", violation {c['violation']}" if c["violation"] else ""
      call = json.dumps(c["arguments"]) if c["tool"] else "(unreadable call)"
      lines.append(f"  tool {c['tool'] or '?'} {call}{status}{bad}, {c['seconds']:.2f} s:")
      lines += [f"    {x}" for x in c["output"].splitlines() or [""]]
  final = row.get("verified_text")
  if final is not None and (not turns or final != turns[-1]["text"]):
    lines.append("final state (scored):")
    lines += [f"    {x}" for x in final.splitlines() or [""]]
  lines.append(f"reward {row['reward']:.3g} (score {row['score']:.3g}"
               + (f", violations {', '.join(row['violations'])}" if row["violations"] else "")
               + f"), {row['finish_reason']}, outcome {row['outcome'] or '-'}")
  return "\n".join(lines)


class TrajectoryStore:
  """Writes WORKDIR/trajectories/step_XXXXXXXX.parquet, one file per step, atomically."""

  def __init__(self, directory: str):
    self.directory = os.path.abspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    for fn in os.listdir(self.directory):
      if fn.startswith(".") and fn.endswith(".tmp"):  # torn write of a crashed run
        os.remove(os.path.join(self.directory, fn))

  def steps(self) -> list[int]:
    """Steps that have a committed file, ascending."""
    return sorted(int(m.group(1)) for fn in os.listdir(self.directory)
                  if (m := _FILE_RE.match(fn)))

  def write_step(self, step: int, rollouts: Sequence[Rollout], *,
                 advantages: Sequence[float] | np.ndarray | None = None,
                 errors: Sequence[str] | None = None,
                 outcomes: Sequence[str] | None = None) -> str:
    """Writes (or replaces) the file of `step`; returns its path."""
    table = rollouts_to_table(step, rollouts,
                              None if advantages is None else list(np.asarray(advantages)),
                              errors, outcomes)
    path = step_file(self.directory, step)
    tmp = os.path.join(self.directory, f".{os.path.basename(path)}.tmp")
    pq.write_table(table, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)
    os.replace(tmp, path)
    return path

  def discard_after(self, step: int) -> list[int]:
    """Deletes files of steps > `step` (resume from the checkpoint of `step`);
    returns the discarded steps."""
    gone = [s for s in self.steps() if s > step]
    for s in gone:
      os.remove(step_file(self.directory, s))
    return gone


def read_trajectories(directory: str, steps: Sequence[int] | None = None,
                      columns: Sequence[str] | None = None) -> pa.Table:
  """All (or the given) steps' trajectories as one table, in step order."""
  store = TrajectoryStore(directory)
  have = store.steps()
  if steps is not None:
    missing = sorted(set(steps) - set(have))
    if missing:
      raise FileNotFoundError(f"no trajectory file for steps {missing} in {directory}")
    have = [s for s in have if s in set(steps)]
  if not have:
    return SCHEMA.empty_table() if columns is None else SCHEMA.empty_table().select(columns)
  wanted = SCHEMA.names if columns is None else list(columns)

  def read(path: str) -> pa.Table:
    if columns is None:
      return _conform(pq.read_table(path), wanted)
    names = pq.read_schema(path).names  # (an older file may lack a requested column)
    return _conform(pq.read_table(path, columns=[c for c in columns if c in names]), wanted)
  return pa.concat_tables([read(step_file(directory, s)) for s in have])
