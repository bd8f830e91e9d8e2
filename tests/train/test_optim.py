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


def test_adam_moments_are_created_in_their_parameters_shardings():
  """On a data=2 x seq=4 mesh (parameters split over seq by the rules table) the
  optimizer state's moments come out of `init_state` in each parameter's own sharding,
  counters replicated: no device holds a whole moment (a bare jit(tx.init) put them
  whole on device 0, and the learner then replicated them on all 8)."""
  from rlpt.models import random_model
  from rlpt.models import sharding as shd
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
  cfg = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  mesh = shd.make_mesh(data=2, seq=4)
  params = nnx.state(random_model(cfg, seed=0, mesh=mesh), nnx.Param)
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  tx = optim.make_optimizer(optim.OptimConfig(lr=1e-3))
  state = optim.init_state(tx, params, rest=repl)
  p_leaves = jax.tree.leaves(params)
  moments = optax.tree_utils.tree_get_all_with_path(state, "mu") + \
      optax.tree_utils.tree_get_all_with_path(state, "nu")
  assert len(moments) == 2
  for _, m in moments:
    m_leaves = jax.tree.leaves(m)
    assert len(m_leaves) == len(p_leaves)
    for p, x in zip(p_leaves, m_leaves):
      assert x.sharding == p.sharding
      np.testing.assert_array_equal(np.asarray(x), 0.0)
      # 8 devices, split 4 ways over seq and kept on both data rows: 2 copies in all
      held = sum(s.data.size for s in x.addressable_shards)
      parts = {tuple((i.start, i.stop) for i in s.index) for s in x.addressable_shards}
      assert held == x.size * (8 // len(parts))
  assert any(not x.sharding.is_fully_replicated for _, m in moments for x in jax.tree.leaves(m))
  counters = [x for x in jax.tree.leaves(state) if x.ndim == 0]
  assert counters and all(x.sharding == repl for x in counters)
