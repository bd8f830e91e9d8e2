"""Orbax checkpoints: exact restore, shardings, and fallback past corrupt steps."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlpt.train import checkpoint as ckpt_lib


def _state(seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  params = {"w": jax.random.normal(k1, (16, 8)), "b": jnp.zeros((8,), jnp.float32),
            "layers": {"scale": jnp.arange(4, dtype=jnp.bfloat16)}}
  opt = optax.adamw(1e-3)
  opt_state = opt.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  _, opt_state = opt.update(grads, opt_state, params)
  return {"params": params, "opt_state": opt_state, "step": jnp.int32(7), "rng": k2}


def _assert_same(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    if ckpt_lib._is_key(x):
      assert ckpt_lib._is_key(y)
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _empty_like(state):
  return jax.tree.map(lambda x: x if ckpt_lib._is_key(x) else jnp.zeros_like(x), state)


def test_roundtrip_is_exact_with_opt_state_rng_and_extra(tmp_path):
  state = _state()
  extra = {"mixer": {"counters": {"synthetic": 12}, "rng": [1, 2, 3]}, "traj_rows": 96}
  with ckpt_lib.Checkpointer(str(tmp_path / "ck"), keep=2) as ck:
    ck.save(3, state, extra)
    ck.save(5, _state(1), {"x": 1})
    ck.save(9, _state(2), {"x": 2})
    ck.wait()
    assert ck.all_steps() == [5, 9]  # keep=2
  ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), keep=2)
  info = ck.restore(_empty_like(state))
  assert info.step == 9 and info.extra == {"x": 2} and info.skipped == []
  _assert_same(info.state, _state(2))
  # The restored key draws the same numbers as the original.
  np.testing.assert_array_equal(jax.random.uniform(info.state["rng"], (3,)),
                                jax.random.uniform(_state(2)["rng"], (3,)))
  assert isinstance(info.state["opt_state"], type(state["opt_state"]))
  info5 = ck.restore(_empty_like(state), step=5)
  _assert_same(info5.state, _state(1))
  ck.close()


def test_no_checkpoint_returns_none(tmp_path):
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    assert ck.restore(_state()) is None


def test_extra_must_be_json(tmp_path):
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    with pytest.raises(TypeError, match="JSON"):
      ck.save(1, _state(), {"bad": object()})


def test_restore_into_target_shardings(tmp_path):
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "fsdp"))
  x = jnp.arange(64.0).reshape(8, 8)
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    ck.save(1, {"x": x})
  sh = NamedSharding(mesh, P("data", "fsdp"))
  target = {"x": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=sh)}
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    info = ck.restore(target)
  assert info.state["x"].sharding == sh
  np.testing.assert_array_equal(info.state["x"], x)


def _largest_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs
           if f != ckpt_lib.INTEGRITY_FILE]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip"])
def test_corrupt_latest_falls_back_loudly(tmp_path, damage, caplog):
  with ckpt_lib.Checkpointer(str(tmp_path / "ck")) as ck:
    ck.save(1, _state(1), {"s": 1})
    ck.save(2, _state(2), {"s": 2})
  victim = _largest_file(tmp_path / "ck" / "2")
  if damage == "truncate":
    with open(victim, "r+b") as f:
      f.truncate(os.path.getsize(victim) // 2)
  elif damage == "delete":
    os.remove(victim)
  else:
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(victim, "wb").write(bytes(data))
  ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"))
  with caplog.at_level("WARNING"):
    info = ck.restore(_empty_like(_state()))
  assert info.step == 1 and info.extra == {"s": 1}
  _assert_same(info.state, _state(1))
  assert [s for s, _ in info.skipped] == [2]
  assert os.path.relpath(victim, tmp_path / "ck" / "2") in info.skipped[0][1]
  assert "CORRUPT CHECKPOINT at step 2" in caplog.text
  # The bad step was moved aside, so a new save of step 2 works and is restored.
  assert ck.all_steps() == [1]
  assert os.listdir(str(tmp_path / "ck") + ".corrupt")
  ck.save(2, _state(3), {"s": 3})
  info = ck.restore(_empty_like(_state()))
  assert info.step == 2 and info.extra == {"s": 3}
  ck.close()


def test_unverified_step_falls_back_when_orbax_cannot_read_it(tmp_path, caplog):
  """A step that committed but never got its manifest (death right after the
  commit) is accepted only if it restores; a damaged one is skipped."""
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    ck.save(1, _state(1), {"s": 1})
    ck.save(2, _state(2), {"s": 2})
  os.remove(tmp_path / "2" / ckpt_lib.INTEGRITY_FILE)
  victim = _largest_file(tmp_path / "2")
  with open(victim, "r+b") as f:
    f.truncate(3)
  with caplog.at_level("WARNING"), ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    info = ck.restore(_empty_like(_state()))
  assert info.step == 1 and info.skipped[0][0] == 2
  assert "restore failed" in info.skipped[0][1]


def test_all_corrupt_raises(tmp_path):
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    ck.save(1, _state(1))
  os.remove(_largest_file(tmp_path / "1"))
  with ckpt_lib.Checkpointer(str(tmp_path)) as ck:
    with pytest.raises(ckpt_lib.CheckpointError, match="every checkpoint .* is corrupt"):
      ck.restore(_state())
