"""Trajectory store: Parquet per step, atomic writes, exactly-once across resume."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from rlpt.data import trajectories as traj
from rlpt.types import RewardResult, Rollout, Task


def _rollouts(step, n_groups=2, k=3):
  out = []
  for g in range(n_groups):
    task = Task("synthetic", f"p{step}-{g}", answer=str(g), metadata={"n": g})
    for j in range(k):
      ok = (j + g) % 2 == 0
      rr = (RewardResult(score=float(ok), violations=() if ok else ("format",),
                         reward=float(ok) - (0 if ok else 0.1), details={"parsed": str(j)})
            if j != 2 else None)  # sample 2 failed verification: kept, marked
      out.append(Rollout(task=task, prompt_ids=[1, 2, g], completion_ids=[3 + j, 4],
                         completion_text=f"c{j}", logprobs=[-0.5, -1.25 * j],
                         weight_version=step - 1, finish_reason="stop", group_id=g,
                         reward=rr))
  return out


def test_write_and_read_every_field(tmp_path):
  store = traj.TrajectoryStore(str(tmp_path))
  rs = _rollouts(1)
  adv = np.arange(6, dtype=np.float32) - 2.5
  path = store.write_step(1, rs, advantages=adv)
  assert os.path.basename(path) == "step_00000001.parquet"
  t = traj.read_trajectories(str(tmp_path))
  assert t.schema == traj.SCHEMA
  rows = t.to_pylist()
  assert len(rows) == 6
  r = rows[4]  # group 1, sample 1
  assert r["group_id"] == 1 and r["sample_index"] == 1 and r["step"] == 1
  assert r["weight_version"] == 0 and r["prompt"] == "p1-1"
  assert json.loads(r["answer"]) == "1" and json.loads(r["task_metadata"]) == {"n": 1}
  assert r["prompt_ids"] == [1, 2, 1] and r["completion_ids"] == [4, 4]
  np.testing.assert_allclose(r["logprobs"], [-0.5, -1.25])
  assert r["score"] == 1.0 and r["reward"] == 1.0 and r["violations"] == []
  assert json.loads(r["reward_details"]) == {"parsed": "1"}
  assert r["advantage"] == pytest.approx(1.5) and r["error"] == ""
  assert rows[1]["violations"] == ["format"] and rows[1]["reward"] == pytest.approx(-0.1)
  failed = rows[2]
  assert np.isnan(failed["reward"]) and failed["error"] == "unverified"


def test_exactly_once_across_resume(tmp_path):
  store = traj.TrajectoryStore(str(tmp_path))
  for s in (1, 2, 3, 4):
    store.write_step(s, _rollouts(s))
  # Crash: step 5 torn mid-write (temporary left behind), checkpoint was at step 2.
  open(tmp_path / ".step_00000005.parquet.tmp", "wb").write(b"PAR1 torn")
  store = traj.TrajectoryStore(str(tmp_path))
  assert not any(f.endswith(".tmp") for f in os.listdir(tmp_path))
  assert store.discard_after(2) == [3, 4]
  assert store.steps() == [1, 2]
  for s in (3, 4, 5):  # re-run after resume
    store.write_step(s, _rollouts(s, n_groups=1))
  store.write_step(5, _rollouts(5, n_groups=1))  # a replayed step replaces its file
  t = traj.read_trajectories(str(tmp_path))
  steps = t.column("step").to_pylist()
  assert [steps.count(s) for s in (1, 2, 3, 4, 5)] == [6, 6, 3, 3, 3]
  assert t.column("prompt").to_pylist()[12:15] == ["p3-0"] * 3
  sub = traj.read_trajectories(str(tmp_path), steps=[2, 5], columns=["step", "reward"])
  assert sub.column_names == ["step", "reward"] and sub.num_rows == 9
  with pytest.raises(FileNotFoundError, match=r"\[7\]"):
    traj.read_trajectories(str(tmp_path), steps=[7])


def test_files_are_plain_parquet(tmp_path):
  store = traj.TrajectoryStore(str(tmp_path))
  store.write_step(12, _rollouts(12))
  t = pq.read_table(tmp_path / "step_00000012.parquet")
  assert t.num_rows == 6 and set(t.column("domain").to_pylist()) == {"synthetic"}


def test_mismatched_lengths_are_refused(tmp_path):
  store = traj.TrajectoryStore(str(tmp_path))
  with pytest.raises(ValueError, match="advantages has 2 entries for 6 rollouts"):
    store.write_step(1, _rollouts(1), advantages=[0.0, 1.0])
  assert store.steps() == []


def test_empty_dir_reads_empty_table(tmp_path):
  t = traj.read_trajectories(str(tmp_path))
  assert t.num_rows == 0 and t.schema == traj.SCHEMA


def _episode_rollout():
  turns = [{"text": "let me run it <tool_call>...</tool_call>", "span": [0, 3],
            "finish_reason": "stop",
            "tools": [{"tool": "run", "arguments": {"command": "pytest -q"}, "output":
                       "1 failed\nAssertionError: 2", "exit_code": 1, "violation": None,
                       "seconds": 0.25},
                      {"tool": "", "arguments": {}, "output": "tool call error: not JSON",
                       "exit_code": None, "violation": "tool_call", "seconds": 0.0}],
            "env_messages": [], "env_tokens": 2},
           {"text": "<answer>fixed</answer>", "span": [5, 7], "finish_reason": "stop",
            "tools": [], "env_messages": [], "env_tokens": 0}]
  return Rollout(task=Task("code_repair", "fix f"), prompt_ids=[1, 2],
                 completion_ids=[3, 4, 5, 9, 9, 6, 7], completion_text="...",
                 logprobs=[-1.0, -1.0, -1.0, 0.0, 0.0, -0.5, -0.5], weight_version=3,
                 finish_reason="stop", reward=RewardResult(1.0, ("tool_call",), 1.0),
                 completion_mask=[True] * 3 + [False] * 2 + [True] * 2, turns=turns,
                 verified_text="def f(x):\n  return x + 1\n")


def test_episodes_keep_their_turns_and_print_as_a_transcript(tmp_path):
  store = traj.TrajectoryStore(str(tmp_path))
  store.write_step(1, [_episode_rollout()] + _rollouts(1, n_groups=1, k=1))
  t = traj.read_trajectories(str(tmp_path))
  row = t.to_pylist()[0]
  assert row["completion_mask"] == [True] * 3 + [False] * 2 + [True] * 2
  assert json.loads(row["turns"])[0]["tools"][0]["exit_code"] == 1
  assert t.to_pylist()[1]["completion_mask"] == [] and t.to_pylist()[1]["turns"] == "[]"
  text = traj.episode_transcript(t, 0)
  assert text.splitlines()[:4] == [
      "[code_repair] step 1 group 0 sample 0", "user: fix f",
      "assistant (turn 1, stop): let me run it <tool_call>...</tool_call>",
      "  tool run {\"command\": \"pytest -q\"}, exit 1, 0.25 s:"]
  assert "    AssertionError: 2" in text and "(unreadable call), violation tool_call" in text
  assert "assistant (turn 2, stop): <answer>fixed</answer>" in text
  assert row["verified_text"] == "def f(x):\n  return x + 1\n"
  assert "final state (scored):\n    def f(x):\n      return x + 1" in text
  assert t.to_pylist()[1]["verified_text"] is None
  assert text.splitlines()[-1].startswith("reward 1 (score 1, violations tool_call)")
  assert "assistant: c0" in traj.episode_transcript(t, 1)


def test_files_from_before_a_column_existed_still_read(tmp_path):
  store = traj.TrajectoryStore(str(tmp_path))
  store.write_step(1, _rollouts(1))
  old = pq.read_table(traj.step_file(str(tmp_path), 1)).drop(["completion_mask", "turns",
                                                              "verified_text"])
  pq.write_table(old, traj.step_file(str(tmp_path), 1))
  store.write_step(2, [_episode_rollout()])
  t = traj.read_trajectories(str(tmp_path))
  assert t.schema == traj.SCHEMA and t.num_rows == 7
  assert t.column("turns").to_pylist()[:6] == ["[]"] * 6
  assert t.column("verified_text").to_pylist()[:6] == [None] * 6
  sel = traj.read_trajectories(str(tmp_path), columns=["step", "completion_mask"])
  assert sel.column_names == ["step", "completion_mask"] and sel.num_rows == 7
