"""AlgoSpec from config: presets resolve, bad names fail naming the field."""

import importlib

import ml_collections
import pytest

from configs import common
from rlpt.algorithms import presets
from rlpt.algorithms.spec import AlgoSpec

PRESETS = {
    "grpo": dict(advantage="group_norm", loss_agg="seq_mean_token_mean", kl_coef=0.04,
                 kl_estimator="k3", kl_in="loss"),
    "dr_grpo": dict(advantage="group_mean", loss_agg="constant", kl_coef=0.0,
                    loss_agg_constant=128.0),
    "dapo": dict(clip_eps_low=0.2, clip_eps_high=0.28, loss_agg="token_mean", kl_coef=0.0),
    "rloo": dict(advantage="rloo", kl_in="reward", kl_estimator="k1",
                 loss_agg="seq_mean_token_sum"),
    "reinforce_pp": dict(advantage="reinforce_pp", kl_in="reward"),
    "ppo": dict(advantage="gae", gae_lambda=0.95, value_coef=0.5),
    "gspo": dict(policy_loss="gspo", clip_eps_low=3e-4, clip_eps_high=4e-4),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets(name):
  cfg = importlib.import_module(f"configs.{name}").get_config()
  fields = presets.get(name, max_new_tokens=cfg.rollout.max_new_tokens)
  assert {k: cfg.rl[k] for k in fields} == fields  # configs/NAME.py applies preset NAME
  spec = AlgoSpec.from_config(cfg.rl, max_new_tokens=cfg.rollout.max_new_tokens)
  for k, v in PRESETS[name].items():
    assert getattr(spec, k) == pytest.approx(v), (name, k)
  assert set(cfg.keys()) == set(common.base_config().keys())
  if name == "dapo":
    assert cfg.rl.dynamic_sampling and cfg.rl.overlong_buffer > 0


def test_default_config_resolves():
  spec = AlgoSpec.from_config(common.base_config().rl)
  assert spec.advantage == "group_norm" and not spec.uses_reference and hash(spec)


def test_bad_fields_name_the_field():
  rl = common.base_config().rl
  rl.advantage = "grpo"
  with pytest.raises(ValueError, match=r"config.rl.advantage = 'grpo'.*group_norm"):
    AlgoSpec.from_config(rl)
  with pytest.raises(ValueError, match=r"config.rl.kl_in = 'both'"):
    AlgoSpec(kl_in="both")
  with pytest.raises(ValueError, match=r"config.rl.loss_agg_constant"):
    AlgoSpec.from_config(ml_collections.ConfigDict(dict(loss_agg="constant")))


def test_unknown_preset_names_the_choices():
  with pytest.raises(ValueError, match=r"unknown algorithm preset 'dapoo'; did you mean 'dapo'"):
    presets.get("dapoo", max_new_tokens=8)
  assert presets.names() == sorted(PRESETS)
