"""Workdir layout and the resume guard."""

import json

import ml_collections
import pytest

from rlpt.train import workdir as workdir_lib


def _cfg(lr=1e-3, steps=10):
  return ml_collections.ConfigDict({"rl": {"lr": lr}, "total_steps": steps})


def test_layout_and_config_json(tmp_path):
  wd = workdir_lib.prepare_workdir(str(tmp_path / "w"), _cfg())
  assert json.load(open(wd.config_json)) == {"rl": {"lr": 1e-3}, "total_steps": 10}
  for d in (wd.checkpoints, wd.trajectories, wd.tb):
    assert (tmp_path / "w" / d.rsplit("/", 1)[1]).is_dir()


def test_same_config_resumes_and_total_steps_may_grow(tmp_path):
  workdir_lib.prepare_workdir(str(tmp_path), _cfg())
  workdir_lib.prepare_workdir(str(tmp_path), _cfg())
  wd = workdir_lib.prepare_workdir(str(tmp_path), _cfg(steps=20))
  assert json.load(open(wd.config_json))["total_steps"] == 20


def test_different_config_is_refused_naming_field(tmp_path):
  workdir_lib.prepare_workdir(str(tmp_path), _cfg())
  with pytest.raises(workdir_lib.WorkdirConfigMismatch, match=r"rl\.lr: 0\.001 -> 0\.5"):
    workdir_lib.prepare_workdir(str(tmp_path), _cfg(lr=0.5))
  wd = workdir_lib.prepare_workdir(str(tmp_path), _cfg(lr=0.5), allow_config_change=True)
  assert json.load(open(wd.config_json))["rl"]["lr"] == 0.5
