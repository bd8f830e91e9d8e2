"""metrics.jsonl + TensorBoard writer, resume truncation, summary table."""

import glob
import json
import os

import numpy as np

from rlpt.train import metrics, progress


def test_jsonl_rows_and_tensorboard(tmp_path):
  with metrics.MetricsWriter(str(tmp_path)) as w:
    w.write(0, {"loss": np.float32(0.5), "reward_mean": 0.25, "note": "x"})
    w.write(1, {"loss": 0.4, "reward_mean": float("nan")})
  rows = metrics.read_metrics(str(tmp_path))
  assert rows[0] == {"step": 0, "loss": 0.5, "reward_mean": 0.25, "note": "x"}
  assert rows[1]["reward_mean"] == "nan"
  events = glob.glob(os.path.join(tmp_path, "tb", "events.out.tfevents.*"))
  assert events and os.path.getsize(events[0]) > 0
  from tensorboardX.proto import event_pb2  # read back what TensorBoard will see
  import struct
  seen = set()
  with open(events[0], "rb") as f:
    data = f.read()
  i = 0
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
    for v in ev.summary.value:
      seen.add((ev.step, v.tag, round(v.simple_value, 4)))
    i += 12 + n + 4
  assert (0, "loss", 0.5) in seen and (1, "loss", 0.4) in seen


def test_truncate_after_drops_steps_past_checkpoint(tmp_path):
  w = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  for s in range(5):
    w.write(s, {"loss": float(s)})
  assert w.truncate_after(2) == 2
  w.write(3, {"loss": 30.0})
  w.close()
  assert [(r["step"], r["loss"]) for r in metrics.read_metrics(str(tmp_path))] == [
      (0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]


def test_torn_last_line_is_skipped(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "loss": 1}) + "\n{\"step\": 1, \"lo")
  assert metrics.read_metrics(str(tmp_path)) == [{"step": 0, "loss": 1}]


def test_summary_table_aligns():
  t = progress.format_table("holdout", ["domain", "before", "after"],
                            [["math", 0.1, 0.25], ["rg/chain_sum", 0.0, 1.0]])
  lines = t.splitlines()
  assert lines[0] == "holdout"
  assert len({len(l) for l in lines[1:]}) == 1
  assert "rg/chain_sum" in t and "0.25" in t


def test_progress_bar_runs(capsys):
  with progress.ProgressBar(total=3, desc="t", min_interval_s=0) as bar:
    for i in range(3):
      bar.update(i + 1, reward=0.5)
  assert "3/3" in capsys.readouterr().err


def test_summarize_run_splits_time_and_compares_rewards():
  from rlpt.train.metrics import summarize_run
  rows = [{"step": s, "time/step_s": 10.0, "time/rollout_s": 6.0, "time/verify_s": 0.5,
           "time/train_s": 3.0, "time/sync_s": 0.1, "reward_mean": s / 10,
           "reward_mean/math": s / 20, "response_len": 8.0, "logprob_gap_max": 1e-5 * s,
           "dropped_groups": 1} for s in range(1, 7)]
  rows.insert(3, dict(rows[2], reward_mean=99.0))  # step 3 written twice: the last row wins
  rows[2], rows[3] = rows[3], rows[2]
  got = dict(summarize_run(rows))
  assert got["steps"] == "6" and got["wall time"] == "1.0 min"
  assert got["  rollout"] == "36 s (60 %)" and got["  train"] == "18 s (30 %)"
  assert got["  evals, checkpoints, data"] == "2 s (4 %)"
  assert got["reward, first 2 -> last 2 steps"] == "0.150 -> 0.550"
  assert got["  math"] == "0.075 -> 0.275"
  assert got["max |rollout - learner logprob|"] == "6.00e-05"
  assert got["groups dropped (dynamic sampling)"] == "6"
  assert summarize_run([]) == []


def test_summarize_run_in_async_mode_counts_the_learners_own_time():
  """Async: rollout overlaps the learner, so the rest (evals, checkpoints, data) is the
  step time the learner spent neither waiting for data, training nor syncing."""
  from rlpt.train.metrics import summarize_run
  rows = [{"step": s, "time/step_s": 60.0, "time/rollout_s": 50.0, "time/verify_s": 1.0,
           "time/wait_s": 20.0, "time/train_s": 25.0, "time/sync_s": 1.0,
           "async/engine_busy": 0.9, "async/learner_busy": 0.4, "reward_mean": 0.1,
           "async/generated_groups": 4 * s, "async/trained_groups": 4 * s}
          for s in range(1, 5)]
  rows[-1]["time/step_s"] = 300.0   # the last step also scored the holdout: 240 s more
  got = dict(summarize_run(rows))
  assert got["  rollout (producers, overlapped)"] == "200 s (42 %)"
  assert got["  learner waiting for data"] == "80 s (17 %)"
  assert got["  evals, checkpoints, data"] == "296 s (62 %)"
