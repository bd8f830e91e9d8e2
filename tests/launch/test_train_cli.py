"""launch.train's command line: config loading, overrides and their errors."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _train(*args, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("override, named, suggested", [
    ("--config.nonexistent=1", "nonexistent", "total_steps"),
    ("--config.rl.lrr=1", "rl.lrr", "rl.lr"),
    ("--config.rollout.temprature=0.5", "rollout.temprature", "rollout.temperature"),
])
def test_unknown_field_names_it_and_closest_names(override, named, suggested, tmp_path):
  r = _train("--config=configs/smoke.py", override, f"--workdir={tmp_path}/wd")
  assert r.returncode == 2, r.stderr
  assert f"'{named}'" in r.stderr
  assert suggested in r.stderr
  assert "Traceback" not in r.stderr
  assert not (tmp_path / "wd").exists(), "nothing may be written for a bad config"


def test_missing_config_file_suggests_neighbour(tmp_path):
  r = _train("--config=configs/smok.py", f"--workdir={tmp_path}/wd")
  assert r.returncode == 2
  assert "configs/smok.py" in r.stderr and "not found" in r.stderr
  assert "configs/smoke.py" in r.stderr
  assert "Traceback" not in r.stderr


def test_wrong_type_names_field_and_expected_type(tmp_path):
  r = _train("--config=configs/smoke.py", "--config.total_steps=1.5", f"--workdir={tmp_path}/wd")
  assert r.returncode == 2
  assert "total_steps" in r.stderr and "expects int" in r.stderr
  assert "Traceback" not in r.stderr


def test_broken_config_file_is_reported(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(arg=None):\n  return {'a': 1}\n")
  r = _train(f"--config={bad}", f"--workdir={tmp_path}/wd")
  assert r.returncode == 2
  assert str(bad) in r.stderr and "ConfigDict" in r.stderr


def test_cpu_devices_gives_the_mesh_its_host_devices(tmp_path):
  """config.cpu_devices = 8 with a seq = 8 mesh and no XLA_FLAGS: launch.train asks XLA
  for 8 host devices before the config checks count them, so the check after the mesh's
  (an overlong buffer past max_new_tokens) is what fails; with 4 the mesh check names it."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  def train(*args):  # noqa: E306
    return subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/smoke.py",
                           "--config.mesh.seq=8", *args, f"--workdir={tmp_path}/wd"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  r = train("--config.cpu_devices=8", "--config.rl.overlong_buffer=3")
  assert r.returncode == 2, r.stderr
  assert "rl.overlong_buffer = 3" in r.stderr and "visible devices" not in r.stderr, r.stderr
  r = train("--config.cpu_devices=4")
  assert r.returncode == 2 and "fits the 4 visible devices" in r.stderr, r.stderr
  assert not (tmp_path / "wd").exists()


def test_every_config_file_loads():
  from launch import config_cli
  import ml_collections
  names = sorted(p.name for p in (ROOT / "configs").glob("*.py")
                 if p.name not in ("__init__.py", "common.py"))
  assert "default.py" in names and "smoke.py" in names
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    for n in names:
      cfg = config_cli.load_config_file(f"configs/{n}")
      assert isinstance(cfg, ml_collections.ConfigDict), n
      if "total_steps" in cfg:  # training configs (serve/plan configs have none)
        assert cfg.total_steps > 0, n
  finally:
    os.chdir(cwd)


def test_seeds_run_each_in_its_own_workdir_and_end_with_the_gain_table(tmp_path):
  """--seeds=0,1: two launch.train processes, seed_0/ and seed_1/, a several-seed table
  of paired holdout gains and seeds.json; a second call resumes both and only reprints."""
  args = ["--config=configs/smoke.py", "--seeds=0,1", f"--workdir={tmp_path}",
          "--config.total_steps=2", "--config.checkpoint.every=1", "--config.eval.every=0",
          "--config.data.holdout_per_domain=16", "--config.data.synthetic_length=2"]
  r = subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=ROOT,
                     capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  for seed in (0, 1):
    cfg = json.load(open(tmp_path / f"seed_{seed}" / "config.json"))
    assert cfg["seed"] == seed and cfg["total_steps"] == 2
    ev = json.load(open(tmp_path / f"seed_{seed}" / "evals.json"))
    assert len(ev["2"]["domains"]["synthetic"]["correct"]) == 16
  assert "holdout gain over 2 seeds" in r.stdout and "gain mean +- sd" in r.stdout
  report = json.load(open(tmp_path / "seeds.json"))
  assert report["seeds"] == [0, 1]
  assert set(report["domains"]["synthetic"]["seeds"]) == {"seed 0", "seed 1"}
  again = subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert json.load(open(tmp_path / "seeds.json")) == report


def test_long_extraction_config_fits_its_longest_report():
  """configs/long_extraction.py passes the config checks on 8 host devices (seq = 8);
  its reports (the committed range's two ends, tokenized by SmolLM2's tokenizer with the
  chat template) are 16k-17k tokens, and the 32k report of the documented override
  (23000, 46000) fits rollout.max_prompt_len, SFT's max_len and the stretched context
  with the answer budget."""
  import jax
  from launch import config_cli
  from rlpt.data.sources import extraction_tasks
  from rlpt.models import loading
  from rlpt.models import gguf_file
  from rlpt.train import settings as settings_lib
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    cfg = config_cli.load_config_file("configs/long_extraction.py")
  finally:
    os.chdir(cwd)
  s = settings_lib.check_config(cfg)
  assert dict(cfg.mesh)["seq"] == 8 and cfg.cpu_devices == 8
  _, _, tok = gguf_file.read_gguf_checkpoint(loading.resolve_path(cfg.model.name))

  def report_tokens(nominal):
    src = extraction_tasks.ExtractionSource(tokens=(nominal, nominal),
                                            fields=(cfg.data.extraction_fields[1],) * 2)
    return len(tok.apply_chat_template(
        [{"role": "user", "content": src.train(0).prompt}], add_generation_prompt=True,
        tokenize=True))

  lo, hi = map(report_tokens, cfg.data.extraction_tokens)
  assert 16000 <= lo <= hi < 17500, (lo, hi)   # the committed range: 16k-17k tokens
  longest = report_tokens(46000)                 # the docstring's 16k-32k override
  assert 30000 < longest <= cfg.rollout.max_prompt_len <= cfg.sft.max_len, longest
  assert longest + cfg.rollout.max_new_tokens <= cfg.model.context_length
  assert s is not None
