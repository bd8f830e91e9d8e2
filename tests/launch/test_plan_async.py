"""launch.plan async and its simulator (rlpt.train.pipeline_sim): exact answers on tiny
deterministic pipelines, the staleness gate, scaling with members, the shared-host
slowdown and its calibration, the cost fit, bad input, and the CLI."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from launch import plan
from rlpt.train import pipeline_profile
from rlpt.train import pipeline_sim as ps

ROOT = pathlib.Path(__file__).resolve().parents[2]

# gen 0.1 s per token of the longest sample: a batch whose longest is 100 tokens is 10 s.
COSTS = ps.Costs(gen_base_s=0.0, gen_per_token_s=0.1, verify_base_s=1.0, verify_per_sample_s={},
                 train_base_s=4.0, train_per_token_s=0.0, publish_s=0.5, load_s=0.5,
                 host_copy_s=0.0, overhead_s=0.0)
GROUPS = [ps.GroupSample("math", 10, (100, 50, 20, 10))]


def _run(mode="async", costs=COSTS, shape=ps.Shape(), steps=30, **pipe):
  p = ps.Pipeline(mode=mode, **{"prompts_per_step": 2, "n": 4, "max_staleness": 2, **pipe})
  return ps.simulate(p, shape, costs, GROUPS, steps=steps, warmup=4)


def test_sync_is_the_sum_of_the_stages():
  r = _run("sync")
  # G x n / (generate 10 + verify 1 + train 4 + publish 0.5 + load 0.5)
  assert r.traj_per_s == pytest.approx(8 / 16.0)
  assert r.engine_busy == pytest.approx(10 / 16)
  assert r.learner_busy == pytest.approx(5 / 16)
  assert r.staleness_hist == {0: 60}   # trained groups
  assert r.step_s == pytest.approx([16.0] * 30)


def test_async_overlaps_generation_and_training():
  # generation-bound: the member runs round after round, one weight load between them
  r = _run("async")
  assert r.traj_per_s == pytest.approx(8 / (10 + 0.5), rel=1e-6)
  assert r.traj_per_s > 1.3 * _run("sync").traj_per_s
  # learner-bound: training 20 s hides generation entirely
  slow = dataclasses.replace(COSTS, train_base_s=20.0)
  r = _run("async", costs=slow)
  assert r.traj_per_s == pytest.approx(8 / 20.0, rel=1e-6)
  assert r.learner_busy == pytest.approx(1.0)
  assert r.traj_per_s == pytest.approx(8 / max(10 + 0.5, 20.0), rel=1e-6)


def test_the_staleness_gate_caps_staleness_and_wastes_nothing():
  for k in (1, 2, 3):
    r = _run("async", max_staleness=k, buffer_groups=16, async_rounds=4)
    assert max(r.staleness_hist) <= k
    assert r.stale_groups == 0   # the gate starts no round the learner would drop
  # with a slow learner the engine runs ahead as far as the bound allows, no further
  slow = dataclasses.replace(COSTS, train_base_s=30.0, gen_per_token_s=0.01)
  r = _run("async", costs=slow, max_staleness=1, buffer_groups=16, async_rounds=4)
  assert set(r.staleness_hist) <= {0, 1} and r.staleness_hist.get(1, 0) > 0


def test_more_members_help_until_the_learner_is_the_bottleneck():
  # a round of 8 prompts in batches of 2 prompts per member: 4 batches of 10 s; a
  # generous staleness bound (loads wait behind queued batches, the gate is tested above)
  def rate(members, train_s, speedup=1.0):
    costs = dataclasses.replace(COSTS, train_base_s=train_s, load_s=0.0, publish_s=0.0)
    return _run("async", costs=costs, shape=ps.Shape(members=members, learner_speedup=speedup),
                prompts_per_step=8, max_batch_prompts=2, buffer_groups=16,
                max_staleness=6).traj_per_s
  assert [rate(m, 6.0) for m in (1, 2, 4)] == pytest.approx([32 / 40, 32 / 20, 32 / 10],
                                                            rel=0.01)
  # a 15 s learner: members help until 4 (a round per 10 s), where the learner caps it
  assert [rate(m, 15.0) for m in (1, 2, 4, 8)] == pytest.approx(
      [32 / 40, 32 / 20, 32 / 15, 32 / 15], rel=0.01)
  assert rate(4, 15.0, speedup=2.0) == pytest.approx(32 / 10, rel=0.01)


def test_a_shared_host_slows_overlapped_work():
  shared = dataclasses.replace(COSTS, host_slowdown=2.0)
  r = _run("async", costs=shared)
  assert r.traj_per_s < _run("async").traj_per_s
  assert _run("sync", costs=shared).traj_per_s == pytest.approx(0.5)  # sync never overlaps


def _fake_run(mode="sync", steps=8, seed=0, slow=1.0, gen_slow=1.0):
  """(config.json, metrics rows, trajectory columns) of a run whose costs are known:
  rollout 2 + 0.05 x longest, verify 0.5 + 0.1 per code sample, train (1 + 0.01 x
  token) x slow; an async run's engine is busy `gen_slow` x each step's rollout."""
  import random
  rnd = random.Random(seed)
  G, n = 4, 4
  config = {"rl": {"mode": mode, "max_staleness": 2 if mode == "async" else 0,
                   "async_rounds": 2, "buffer_groups": 0},
            "data": {"prompts_per_step": G}, "rollout": {"n": n, "max_new_tokens": 192,
                                                         "engine": "fleet"},
            "fleet": {"members": 1}}
  rows, traj = [], {k: [] for k in pipeline_profile.TRAJ_COLUMNS}
  for s in range(1, steps + 1):
    longest = tokens = code = 0
    for g in range(G):
      dom = ["code", "math"][rnd.randrange(2)]
      prompt = 20 + rnd.randrange(40)
      for k in range(n):
        L = rnd.randrange(5, 190)
        for col, v in (("step", s), ("group_id", s * G + g), ("domain", dom),
                       ("outcome", "trained"), ("weight_version", s - 1),
                       ("prompt_ids", [1] * prompt), ("completion_ids", [2] * L)):
          traj[col].append(v)
        longest, tokens, code = max(longest, L), tokens + prompt + L, code + (dom == "code")
    gen, ver, train = 2 + 0.05 * longest, 0.5 + 0.1 * code, (1 + 0.01 * tokens) * slow
    rows.append({"step": s, "time/rollout_s": gen, "time/verify_s": ver, "time/train_s": train,
                 "time/sync_s": 2.0, "time/step_s": gen + ver + train + 2.0 + 0.3})
    if mode == "async":  # cumulative, as AsyncCollector.metrics
      wall = rows[-2]["async/wall_s"] if s > 1 else 0.0
      busy = rows[-2]["async/engine_busy_s"] if s > 1 else 0.0
      rows[-1].update({"async/wall_s": wall + rows[-1]["time/step_s"],
                       "async/engine_busy_s": busy + gen_slow * gen})
  return config, rows, traj


def test_the_cost_fit_recovers_known_costs():
  prof = pipeline_profile.make_profile(*_fake_run(), source="fake")
  c = pipeline_profile.fit_costs(prof, warmup=2)
  assert c.gen_base_s == pytest.approx(2.0, abs=1e-6)
  assert c.gen_per_token_s == pytest.approx(0.05, rel=1e-6)
  assert c.train_per_token_s == pytest.approx(0.01, rel=1e-6)
  assert c.verify_per_sample_s["code"] == pytest.approx(0.1, rel=1e-3)
  assert c.verify_per_sample_s["math"] == pytest.approx(0.0, abs=1e-3)
  assert c.overhead_s == pytest.approx(0.3)
  assert c.publish_s + c.load_s == pytest.approx(2.0)
  m = pipeline_profile.measured(prof, warmup=2)
  assert m["trained"] == 6 * 16 and m["staleness"] == {0: 1.0}
  # the simulated sync run of the fitted model reproduces the run's own throughput
  pred = pipeline_profile.predict(prof, shape=ps.Shape(), overrides={}, steps=6, warmup=2, replicas=30,
                      seed=0)
  assert pred["sync"]["traj_per_s"]["mean"] == pytest.approx(m["traj_per_s"], rel=0.1)
  assert pred["async"]["traj_per_s"]["mean"] > pred["sync"]["traj_per_s"]["mean"]


def test_bad_input_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
    pipeline_profile.load_run(str(tmp_path))
  config, rows, traj = _fake_run()
  for r in rows:
    del r["time/train_s"]
  with pytest.raises(ValueError, match=r"lacks \['time/train_s'\]"):
    pipeline_profile.make_profile(config, rows, traj, source="x")
  with pytest.raises(ValueError, match="fit the cost model on a sync-mode run"):
    pipeline_profile.fit_costs(pipeline_profile.make_profile(*_fake_run("async"), source="y"), warmup=2)


def _write_workdir(root: pathlib.Path, config, rows, traj) -> None:
  import pyarrow as pa
  import pyarrow.parquet as pq
  (root / "trajectories").mkdir(parents=True)
  (root / "config.json").write_text(json.dumps(config))
  (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  pq.write_table(pa.table(traj), root / "trajectories" / "step_1.parquet")


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "launch.plan", "async", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)


def test_cli_reads_a_workdir_and_writes_json(tmp_path):
  _write_workdir(tmp_path / "run", *_fake_run())
  out = tmp_path / "plan.json"
  r = _cli(f"--metrics_from={tmp_path / 'run'}", "--rollout_members=2", "--replicas=3",
           f"--json={out}", f"--save_profile={tmp_path / 'profile.json'}")
  assert r.returncode == 0, r.stderr
  assert "trained traj/s" in r.stdout and "sync (measured)" in r.stdout
  pred = json.loads(out.read_text())
  assert pred["shape"]["members"] == 2 and pred["async"]["traj_per_s"]["mean"] > 0
  again = _cli(f"--metrics_from={tmp_path / 'profile.json'}", "--replicas=3")
  assert again.returncode == 0, again.stderr
  bad = _cli(f"--metrics_from={tmp_path / 'nowhere'}")
  assert bad.returncode != 0 and "neither a run's workdir nor a profile" in bad.stderr


def test_the_host_slowdowns_are_calibrated_on_the_learner_and_engine_of_an_async_run():
  fit = pipeline_profile.make_profile(*_fake_run(), source="sync")
  config, rows, traj = _fake_run("async", seed=1, slow=1.6, gen_slow=1.8)
  run = pipeline_profile.make_profile(config, rows, traj, source="async")
  m = pipeline_profile.measured(run, warmup=2)
  window = rows[2:]
  assert m["engine_busy"] == pytest.approx(
      1.8 * sum(r["time/rollout_s"] for r in window) / sum(r["time/step_s"] for r in window))
  cal = pipeline_profile.calibrate_host_slowdown(fit, run, 2, shape=ps.Shape(), replicas=4)
  assert cal["measured"]["learner"] == pytest.approx(1.6, rel=1e-6)
  engine_s = m["engine_busy"] * m["wall_s"] / m["trained"]
  assert cal["measured"]["member_engine_s_per_traj"] == pytest.approx(engine_s, rel=1e-6)
  # the simulated run at the calibrated factors reproduces both measured figures
  assert cal["simulated"]["learner"] == pytest.approx(1.6, rel=0.03)
  assert cal["simulated"]["member_engine_s_per_traj"] == pytest.approx(engine_s, rel=0.03)
  f_member = cal["slowdown_by_kind"]["gen"]
  assert 1.0 < cal["host_slowdown"] < 6.0 and 1.0 < f_member < 6.0
  assert cal["slowdown_by_kind"] == {"gen": f_member, "load": f_member}
  # and so does an independent simulation with them
  costs = pipeline_profile.fit_costs(fit, 2, host_slowdown=cal["host_slowdown"],
                                     slowdown_by_kind=cal["slowdown_by_kind"])
  p = pipeline_profile.profile_pipeline(run)
  t = [ps.simulate_many(p, ps.Shape(), c, pipeline_profile.profile_groups(run), steps=6,
                        replicas=4)["train_s"]["mean"]
       for c in (costs, pipeline_profile.fit_costs(fit, 2))]
  assert t[0] / t[1] == pytest.approx(1.6, rel=0.03)
  with pytest.raises(ValueError, match="on an async run"):
    pipeline_profile.calibrate_host_slowdown(fit, fit, 2, shape=ps.Shape())


def test_each_kind_of_work_slows_by_its_own_factor():
  """Two overlapped jobs: a member batch (kind gen) and a learner update (kind train)
  started together; each runs at 1 / F of its solo speed while both run, then alone."""
  sim = ps._Sim(lambda kind: {"gen": 3.0, "train": 1.5}.get(kind, 1.0))
  ends = {}

  def job(name, seconds, kind):
    yield ps._Work(seconds, kind)
    ends[name] = sim.now
  done = [sim.start(job("gen", 6.0, "gen")), sim.start(job("train", 6.0, "train"))]
  sim.run(done[0])
  sim.run(done[1])
  # train at 1/1.5 finishes its 6 s at t=9, gen has done 9/3 = 3 s then runs alone: t=12
  assert ends == pytest.approx({"train": 9.0, "gen": 12.0})
  with pytest.raises(ValueError, match="work kind 'gpu'"):
    sim.start(job("x", 1.0, "gpu"))
    sim.run(sim.event())


def test_cli_compares_with_an_async_run_and_calibrates_on_it(tmp_path):
  _write_workdir(tmp_path / "sync", *_fake_run())
  _write_workdir(tmp_path / "async", *_fake_run("async", seed=1, slow=1.3))
  r = _cli(f"--metrics_from={tmp_path / 'sync'}", f"--compare_with={tmp_path / 'async'}",
           f"--host_slowdown_from={tmp_path / 'async'}", "--replicas=3")
  assert r.returncode == 0, r.stderr
  assert "async (measured)" in r.stdout and "learner ran 1.30x" in r.stdout
  assert "its engine was busy" in r.stdout and ", gen " in r.stdout


def test_the_memory_plan_invocation_is_unchanged():
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  r = subprocess.run([sys.executable, "-m", "launch.plan", "other"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "unexpected arguments: ['other']" in r.stderr
  r = subprocess.run([sys.executable, "-m", "launch.plan"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "--config=configs/NAME.py is required" in r.stderr
