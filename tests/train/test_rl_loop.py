"""The synchronous RL loop: config checks, the smoke run through launch.train, and
exact resume after a SIGKILL."""

import dataclasses
import importlib
import json
import os
import pathlib
import subprocess
import sys

import ml_collections
import numpy as np
import pyarrow.parquet as pq
import pytest

from configs import smoke
from rlpt.train import build, rl_loop, settings
from rlpt.train.metrics import read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
K = 2  # the killed run dies right after step K; step K + 1 must match the clean run


@pytest.mark.parametrize("field, value, match", [
    ("rollout.n", 1, r"config.rollout.n = 1: expected >= 2 for group-relative"),
    ("rl.microbatch_size", 5, r"config.rl.microbatch_size = 5: expected a divisor of"),
    ("rl.advantage", "nope", r"config.rl.advantage = 'nope'"),
    ("model.name", "/no/such/model", r"model.name '/no/such/model' is neither"),
    ("total_steps", 0, r"config.total_steps = 0"),
    ("rollout.engine", "vllm", r"rollout.engine = 'vllm'"),
    ("rl.max_staleness", -1, r"config.rl.max_staleness = -1: expected >= 0"),
    ("fleet.kind", "k8s", r"config.fleet.kind = 'k8s': expected one of"),
    ("rl.dynamic_sampling_oversample", 0.5,
     r"config.rl.dynamic_sampling_oversample = 0.5: expected between 1 and 16"),
    ("eval.base_tasks", -2, r"config.eval.base_tasks = -2: expected >= 0 tasks"),
    ("rollout.max_wall_s", -1.0, r"config.rollout.max_wall_s = -1.0: expected seconds >= 0"),
    ("data.extraction_tokens", (3000, 2000),
     r"config.data.extraction_tokens = \(3000, 2000\): expected \(min, max\)"),
    ("model.context_length", -1, r"config.model.context_length = -1: expected >= 0"),
    ("model.rope_scaling", ml_collections.ConfigDict({"rope_type": "yarn"}),
     r"config.model.rope_scaling = \{'rope_type': 'yarn'\}: expected a rope_type among"),
    ("cpu_devices", -1, r"config.cpu_devices = -1"),
])
def test_config_errors_name_the_field(field, value, match):
  c = smoke.get_config()
  obj = c
  *parents, leaf = field.split(".")
  for p in parents:
    obj = obj[p]
  obj[leaf] = value
  with pytest.raises(settings.ConfigError, match=match):
    settings.Settings.from_config(c)


def test_extraction_lengths_and_a_longer_context_come_from_the_config():
  """data.extraction_tokens / extraction_fields reach the extraction source build makes
  (reports of 16k-32k tokens, chars / 4), a bad range is a ConfigError naming them, and
  model.context_length / rope_scaling extend the policy's context on the same weights."""
  from rlpt.models import decoder
  from rlpt.train import policy
  c = smoke.get_config()
  c.data.domains = ml_collections.ConfigDict({"extraction": 1.0})
  c.data.extraction_tokens, c.data.extraction_fields = (16000, 32000), (1, 2)
  c.model.context_length = 40960
  c.model.rope_scaling = ml_collections.ConfigDict({"rope_type": "linear", "factor": 5.0})
  s = settings.Settings.from_config(c)
  src = build.task_source("extraction", s.data, seed=0)
  tasks = [src.train(i) for i in range(3)]
  assert all(15000 <= t.metadata["tokens"] <= 32000 for t in tasks), [t.metadata for t in tasks]
  assert all(1 <= len(t.answer) <= 3 for t in tasks)  # the fields asked, + a restated one
  c.data.extraction_tokens = (100, 200)
  with pytest.raises(settings.ConfigError, match=r"data.extraction_tokens.*500 <= min"):
    build.task_source("extraction", settings.Settings.from_config(c).data, seed=0)
  cfg = decoder.ModelConfig(max_position_embeddings=8192, rope_theta=100000.0)
  class _Policy:  # noqa: E306  (the config is all with_context touches)
    config = cfg
  p = policy.with_context(_Policy(), s.model)
  assert p.config.max_position_embeddings == 40960
  np.testing.assert_allclose(decoder.rope_inv_freq(p.config), decoder.rope_inv_freq(cfg) / 5.0,
                             rtol=1e-6)


def test_the_learner_trains_the_rollout_temperatures_distribution():
  c = smoke.get_config()
  c.rollout.temperature = 0.7
  s = settings.Settings.from_config(c)
  assert s.rl.algo.temperature == 0.7
  c.rollout.temperature = 0.0          # greedy rollouts: the policy itself
  assert settings.Settings.from_config(c).rl.algo.temperature == 1.0
  c.rollout.temperature, c.rollout.top_p = 0.7, 0.9
  with pytest.raises(settings.ConfigError, match=r"rollout.temperature = 0.7: expected 1 "
                     r"\(or 0\) when rollout.top_p < 1"):
    settings.Settings.from_config(c)


def test_the_wall_cap_reaches_sampling_and_is_refused_for_outside_servers():
  c = smoke.get_config()
  assert settings.Settings.from_config(c).rollout.sampling().max_wall_s is None  # 0 = off
  c.rollout.max_wall_s = 30.0
  assert settings.Settings.from_config(c).rollout.sampling().max_wall_s == 30.0
  c.rollout.engine, c.fleet.kind, c.fleet.urls = "fleet", "url", "http://a:1"
  with pytest.raises(settings.ConfigError, match=r"rollout.max_wall_s = 30.0: expected 0 with "
                     r"fleet.kind = 'url'"):
    settings.Settings.from_config(c)


def test_every_config_field_is_read():
  """A field nothing reads is refused (a stale or misspelt one in a config file)."""
  for name in ("smoke", "default", "grpo", "dapo", "dr_grpo", "gspo", "ppo", "reinforce_pp",
               "rloo"):
    settings.Settings.from_config(importlib.import_module(f"configs.{name}").get_config())
  c = smoke.get_config()
  c.rl.algorithm = "grpo"
  with pytest.raises(settings.ConfigError, match=r"\['rl.algorithm'\] are read by nothing"):
    settings.Settings.from_config(c)


def test_engine_sizes_come_from_config_fields():
  s = settings.Settings.from_config(smoke.get_config())
  e = s.rollout.engine_config(seed=3)
  assert (e.max_len, e.min_prompt_bucket, e.length_multiple, e.kv_cache_mib) == (66, 16, 16, 64)
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.rollout.n = 3


def test_unknown_domain_is_a_config_error():
  c = smoke.get_config()
  c.data.domains = {"synthetic": 1.0, "rg/chain_summ": 1.0}
  with pytest.raises(settings.ConfigError, match=r"'rg/chain_summ'.*did you mean.*rg/chain_sum"):
    settings.Settings.from_config(c)


def test_math_generators_pick_the_math_source():
  c = smoke.get_config()
  c.data.domains = {"synthetic": 1.0, "math": 1.0}
  c.data.math_generators = "lcm, gcd"
  src = build.task_source("math", settings.Settings.from_config(c).data, seed=0)
  assert src.generators == ("lcm", "gcd")
  assert {src.train(i).metadata["generator"] for i in range(4)} == {"lcm", "gcd"}
  c.data.math_generators = "lcm,gdc"
  with pytest.raises(settings.ConfigError, match=r"data.math_generators: .*\['gdc'\]"):
    settings.Settings.from_config(c)


def test_rg_config_reaches_the_source_and_bad_fields_are_config_errors():
  c = smoke.get_config()
  c.data.domains = {"synthetic": 1.0, "rg/chain_sum": 1.0}
  c.data.rg_config = {"rg/chain_sum": {"max_terms": 2, "max_digits": 1}}
  settings.Settings.from_config(c)
  src = build.task_source("rg/chain_sum", settings.Settings.from_config(c).data, seed=0)
  assert src.config == (("max_digits", 1), ("max_terms", 2))
  c.data.rg_config = {"rg/chain_sum": {"max_termz": 2}}
  with pytest.raises(settings.ConfigError, match=r"data.rg_config.rg/chain_sum: .*max_termz"):
    settings.Settings.from_config(c)


def _train_cmd(workdir, *extra):
  return [sys.executable, "-m", "launch.train", "--config=configs/smoke.py",
          f"--config.total_steps={K + 1}", "--config.checkpoint.every=1",
          "--config.eval.every=0", "--config.data.holdout_per_domain=0",
          f"--workdir={workdir}", *extra]


def _env(cache_dir, fault=None):
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  # One compilation cache for the three processes: only the first one compiles.
  env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  env.pop(rl_loop.FAULT_ENV, None)
  if fault is not None:
    env[rl_loop.FAULT_ENV] = str(fault)
  return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A clean run of K+1 steps, and a run killed after step K then restarted."""
  tmp = tmp_path_factory.mktemp("rl")
  cache = tmp / "jax_cache"
  clean = subprocess.run(_train_cmd(tmp / "clean"), cwd=ROOT, env=_env(cache),
                         capture_output=True, text=True, timeout=600)
  killed = subprocess.run(_train_cmd(tmp / "resumed"), cwd=ROOT, env=_env(cache, fault=K),
                          capture_output=True, text=True, timeout=600)
  restarted = subprocess.run(_train_cmd(tmp / "resumed"), cwd=ROOT, env=_env(cache),
                             capture_output=True, text=True, timeout=600)
  return dict(tmp=tmp, clean=clean, killed=killed, restarted=restarted)


def test_smoke_run_writes_metrics(runs):
  r = runs["clean"]
  assert r.returncode == 0, r.stderr[-3000:]
  rows = [x for x in read_metrics(str(runs["tmp"] / "clean")) if x["step"] > 0]
  assert [x["step"] for x in rows] == list(range(1, K + 2))
  for x in rows:
    assert np.isfinite(x["loss"]) and 0.0 <= x["reward_mean"] <= 1.0
    for k in ("time/rollout_s", "time/verify_s", "time/train_s", "time/sync_s", "grad_norm"):
      assert k in x
    assert x["logprob_gap_max"] < 1e-4  # engine and learner agree on the logprobs
  # The command-line overrides reached the resolved config.
  cfg = json.loads((runs["tmp"] / "clean" / "config.json").read_text())
  assert cfg["total_steps"] == K + 1 and cfg["checkpoint"]["every"] == 1
  assert cfg["data"]["holdout_per_domain"] == 0
  files = sorted(os.listdir(runs["tmp"] / "clean" / "trajectories"))
  assert files == [f"step_{s:08d}.parquet" for s in range(1, K + 2)]
  assert os.listdir(runs["tmp"] / "clean" / "tb")


def test_killed_run_resumes_exactly(runs):
  assert runs["killed"].returncode == -9, runs["killed"].stderr[-3000:]
  r = runs["restarted"]
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from step" in r.stderr
  clean = {x["step"]: x for x in read_metrics(str(runs["tmp"] / "clean"))}
  resumed = {x["step"]: x for x in read_metrics(str(runs["tmp"] / "resumed"))}
  assert sorted(resumed) == sorted(clean), "no step lost or counted twice"
  for step in range(1, K + 2):
    a = {k: v for k, v in clean[step].items() if not k.startswith("time/")}
    b = {k: v for k, v in resumed[step].items() if not k.startswith("time/")}
    assert a == b, f"step {step} differs"
  assert resumed[K + 1]["loss"] == clean[K + 1]["loss"]
  cols = ["step", "prompt", "completion_ids", "logprobs", "reward", "advantage", "weight_version"]
  for step in range(1, K + 2):
    name = f"step_{step:08d}.parquet"
    ta = pq.read_table(runs["tmp"] / "clean" / "trajectories" / name, columns=cols)
    tb = pq.read_table(runs["tmp"] / "resumed" / "trajectories" / name, columns=cols)
    assert ta.equals(tb), f"trajectories of step {step} differ"


def test_changed_config_refuses_to_resume(runs):
  r = subprocess.run(_train_cmd(runs["tmp"] / "clean", "--config.rl.lr=0.5"), cwd=ROOT,
                     env=_env(runs["tmp"] / "jax_cache"), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 2
  assert "rl.lr" in r.stderr and "refusing to resume" in r.stderr
  assert "Traceback" not in r.stderr


LEARN_STEPS = 100


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo"])
def test_tiny_model_learns_the_synthetic_task(preset, tmp_path, capsys):
  """reward <= 0.2 at the start, >= 0.8 (mean of the last 5 steps) within
  LEARN_STEPS steps, fixed seed, for each preset's algorithm fields."""
  c = smoke.get_config(preset)
  c.total_steps = LEARN_STEPS
  c.checkpoint.every = LEARN_STEPS
  c.eval.every = 0
  c.data.holdout_per_domain = 64 if preset == "grpo" else 0  # one run also checks evals
  res = rl_loop.train(c, str(tmp_path))
  rewards = [x["reward_mean"] for x in read_metrics(str(tmp_path)) if x["step"] > 0]
  assert len(rewards) == LEARN_STEPS
  assert rewards[0] <= 0.2, rewards[:5]
  assert np.mean(rewards[-5:]) >= 0.8, [round(r, 2) for r in rewards[::5]]
  if preset == "grpo":
    assert sorted(res.evals) == [0, LEARN_STEPS]
    assert set(res.evals[0]) == {"synthetic"} and res.evals[0]["synthetic"]["n"] == 64
    out = capsys.readouterr().out
    assert "holdout accuracy" in out and f"after RL ({LEARN_STEPS} steps)" in out
    assert "run summary" in out and "reward, first 5 -> last 5 steps" in out
    assert json.load(open(tmp_path / "evals.json"))[str(LEARN_STEPS)]["domains"]["synthetic"]
  if preset == "dapo":
    rows = read_metrics(str(tmp_path))
    assert sum(x["dropped_groups"] for x in rows if x["step"] > 0) > 0  # dynamic sampling ran


def test_forgetting_guard_flags_a_forced_drop_and_evaluations_rotate(tmp_path, monkeypatch):
  """Three synthetic domains, one evaluated per intermediate evaluation (in turn); the
  holdout accuracies are forced (evaluate patched): "synthetic/copy" drops from 0.8 at
  step 0 to 0.5 at its next evaluation (step 2), so the guard flags it in the metrics
  and doubles its weight, and lets go when it is back at 0.75 (step 8)."""
  from rlpt.train import evaluation
  acc = {("synthetic/copy", 0): 0.8, ("synthetic/copy", 8): 0.75}   # else 0.5
  seen = []
  real = evaluation.evaluate

  def forced(engine, holdout, **kw):
    out = real(engine, holdout, **kw)
    step = [0, 2, 4, 6, 8, 10][len(seen)]
    seen.append((step, sorted(holdout)))
    for d, e in out.items():
      e["accuracy"] = acc.get((d, step), 0.5)
    return out

  monkeypatch.setattr(evaluation, "evaluate", forced)
  c = smoke.get_config()
  c.total_steps, c.eval.every, c.checkpoint.every = 10, 2, 10
  c.data.domains = ml_collections.ConfigDict(
      {"synthetic/copy": 1.0, "synthetic/reverse": 1.0, "synthetic/sum": 1.0})
  c.data.holdout_per_domain = 4
  c.data.forgetting_margin, c.data.forgetting_boost = 0.2, 2.0
  c.eval.domains_per_eval = 1
  rl_loop.train(c, str(tmp_path))
  doms = ["synthetic/copy", "synthetic/reverse", "synthetic/sum"]
  # step 0 and the last step score every domain; steps 2-8 one each, in rotation
  assert seen == [(0, doms), (2, doms[:1]), (4, doms[1:2]), (6, doms[2:]), (8, doms[:1]),
                  (10, doms)], seen
  rows = {r["step"]: r for r in read_metrics(str(tmp_path))}
  # copy is evaluated at 2 (0.5: 0.3 below its best 0.8 -> flagged) and 8 (0.75: let go)
  assert rows[2]["forgetting/synthetic/copy"] == 1.0 and rows[2]["forgetting/domains"] == 1
  assert rows[2]["mixer/prob/synthetic/copy"] == pytest.approx(0.5)   # weights 2, 1, 1
  assert rows[4]["forgetting/synthetic/copy"] == 1.0                  # not re-evaluated
  assert rows[8]["forgetting/synthetic/copy"] == 0.0
  assert rows[8]["mixer/prob/synthetic/copy"] == pytest.approx(1 / 3)
  assert "forgetting/domains" not in rows[1]


def test_holdout_tasks_longer_than_the_prompt_limit_are_left_out_in_order(caplog):
  from rlpt.models.tokenizer import CharTokenizer
  from rlpt.types import Task
  tok = CharTokenizer(sorted(set("0123456789+= ")))
  tasks = [Task("synthetic", p) for p in ("1+2=", "1+2+3+4+5+6=", "3=", "11+22=")]
  limit = len(tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": "11+22="}], add_generation_prompt=True)))
  kept = build.fitting(tasks, tok, limit, "synthetic")
  assert [t.prompt for t in kept] == ["1+2=", "3=", "11+22="]
  assert "holdout synthetic: 1 of 4 tasks left out" in caplog.text


def test_all_domains_config_reads_and_its_mixer_draws_every_domain():
  """configs/all_domains.py: every registered domain, with a verifier and a task source;
  the run's mixer draws each of them in its first ceil(110 / 8) = 14 steps' prompts."""
  from configs import all_domains
  from rlpt.data import sources
  from rlpt.train import build
  s = settings.Settings.from_config(all_domains.get_config())
  assert sorted(s.data.weights) == sources.domains() and len(s.data.weights) >= 100
  assert (s.data.curriculum, s.data.forgetting_margin, s.eval_domains) == ("learnability", 0.1,
                                                                          12)
  srcs = {d: build.task_source(d, s.data, seed=s.seed) for d in s.data.weights}
  m = build.make_mixer(s, srcs)
  steps = -(-len(srcs) // s.data.prompts_per_step)
  drawn = {t.domain for _ in range(steps) for t in m.sample(s.data.prompts_per_step)}
  assert drawn == set(s.data.weights), sorted(set(s.data.weights) - drawn)
  assert steps <= s.total_steps // 2
