"""Optimizer: schedules by hand, weight-decay mask, clipping, config errors."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlpt.models import Decoder, ModelConfig
from rlpt.train import optim


def test_schedules_by_hand():
  cos = optim.make_schedule(optim.OptimConfig(lr=1.0, schedule="cosine", warmup_steps=2,
                                              total_steps=6))
  # warmup 0 -> 1 over 2 steps, then cosine over the remaining 4 steps to 0
  got = [float(cos(s)) for s in range(7)]
  want = [0.0, 0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * k / 4)) for k in (1, 2, 3, 4)]
  np.testing.assert_allclose(got, want, atol=1e-6)
  lin = optim.make_schedule(optim.OptimConfig(lr=2.0, schedule="linear", total_steps=4,
                                              end_lr_ratio=0.5))
  np.testing.assert_allclose([float(lin(s)) for s in range(5)], [2.0, 1.75, 1.5, 1.25, 1.0])
  const = optim.make_schedule(optim.OptimConfig(lr=3e-4))
  assert float(const(123)) == pytest.approx(3e-4)


def test_decay_mask_skips_norms_and_biases():
  _, params = nnx.split(Decoder(ModelConfig(qkv_bias=True), rngs=nnx.Rngs(0)))
  mask = optim.decay_mask(params)
  get = lambda *path: bool(functools.reduce(lambda d, k: d[k], path, mask)
                           .get_value())
  assert get("embed") and get("layers", "wq") and get("layers", "w_down")
  assert not get("final_norm") and not get("layers", "attn_norm")
  assert not get("layers", "bq")


def test_clipping_and_adamw_first_step():
  tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, max_grad_norm=1.0, weight_decay=0.0))
  params = {"w": jnp.array([1.0, 1.0])}
  state = tx.init(params)
  grads = {"w": jnp.array([30.0, 40.0])}            # norm 50 -> clipped to [0.6, 0.8]
  updates, _ = tx.update(grads, state, params)
  # Adam's first step is lr * g / (|g| + eps) elementwise: -0.1 on each coordinate
  np.testing.assert_allclose(updates["w"], [-0.1, -0.1], rtol=1e-5)
  assert float(optax.tree.norm(grads)) == pytest.approx(50.0)


def test_bad_config():
  with pytest.raises(ValueError, match="config.rl.lr_schedule = 'step'"):
    optim.OptimConfig(schedule="step")
  with pytest.raises(ValueError, match="config.rl.lr = 0"):
    optim.OptimConfig(lr=0)


def test_weight_decay_applies_through_the_mask_on_nnx_state():
  _, params = nnx.split(Decoder(ModelConfig(), rngs=nnx.Rngs(0)))
  tx = optim.make_optimizer(optim.OptimConfig(lr=0.5, weight_decay=0.1))
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  # zero gradient: the update is -lr * wd * w on decayed params, 0 on norms
  np.testing.assert_allclose(updates["layers"]["wq"][...], -0.05 * params["layers"]["wq"][...],
                             rtol=1e-6)
  np.testing.assert_array_equal(updates["final_norm"][...], 0.0)
