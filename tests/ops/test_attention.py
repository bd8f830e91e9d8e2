"""rlpt.ops.attention: blockwise and ring attention against the reference, forward
and gradients, on the 8 fake CPU devices of tests/conftest.py."""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from rlpt.ops import attention as A

B, T, D = 2, 32, 8
RTOL = 1e-5


def _qkv(h, kvh, t=T, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (B, t, h, D), jnp.float32)
  k = jax.random.normal(ks[1], (B, t, kvh, D), jnp.float32)
  v = jax.random.normal(ks[2], (B, t, kvh, D), jnp.float32)
  w = jax.random.normal(ks[3], (B, t, h, D), jnp.float32)  # loss weights
  return q, k, v, w


def _out_and_grads(attn, q, k, v, w):
  """attn(q,k,v) and d/d(q,k,v) of sum(w * attn(q,k,v)), in one jitted call."""
  def f(q, k, v):
    o, vjp = jax.vjp(attn, q, k, v)
    return o, vjp(w)
  return jax.jit(f)(q, k, v)


def _assert_close(got, want, what):
  got, want = np.asarray(got), np.asarray(want)
  err = np.max(np.abs(got - want)) / np.max(np.abs(want))
  assert err <= RTOL, f"{what}: max abs error / max abs = {err:.2e} > {RTOL}"


def _assert_all_close(got, want, what):
  (go, gg), (wo, wg) = got, want
  _assert_close(go, wo, f"{what} output")
  for name, a, b in zip("qkv", gg, wg):
    _assert_close(a, b, f"{what} d{name}")


def _seq_mesh(n):
  return Mesh(np.array(jax.devices()[:n]), ("seq",))


def _shard(mesh, *xs):
  return [jax.device_put(x, NamedSharding(mesh, P(None, "seq"))) for x in xs]


def test_reference_matches_numpy_softmax():
  q, k, v, _ = _qkv(4, 2, t=6)
  o = jax.jit(A.reference_attention)(q, k, v)
  qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
  kn, vn = np.repeat(kn, 2, axis=2), np.repeat(vn, 2, axis=2)  # head h reads kv h // 2
  s = np.einsum("bqhd,bkhd->bhqk", qn, kn) / np.sqrt(D)
  s = np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  want = np.einsum("bhqk,bkhd->bqhd", p, vn)
  np.testing.assert_allclose(np.asarray(o), want, rtol=1e-5, atol=1e-6)


def test_reference_fully_masked_query_is_zero():
  q, k, v, _ = _qkv(2, 2, t=4)
  mask = jnp.array([[False, True, True, True]] * B)  # query 0 sees only key 0: padding
  o = jax.jit(A.reference_attention)(q, k, v, kv_mask=mask)
  assert np.all(np.asarray(o[:, 0]) == 0)
  assert np.all(np.isfinite(np.asarray(o)))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("h,kvh", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_blockwise_matches_reference(causal, h, kvh):
  t = 30  # not a multiple of the blocks: padded and masked internally
  q, k, v, w = _qkv(h, kvh, t=t)
  mask = jnp.arange(t)[None, :] >= jnp.array([0, 3])[:, None]  # row 1 left-padded
  seg = (jnp.arange(t)[None, :] >= 17).astype(jnp.int32) * jnp.ones((B, 1), jnp.int32)
  kw = dict(causal=causal, kv_mask=mask, q_segment_ids=seg, kv_segment_ids=seg)
  want = _out_and_grads(lambda q, k, v: A.reference_attention(q, k, v, **kw), q, k, v, w)
  got = _out_and_grads(lambda q, k, v: A.blockwise_attention(q, k, v, block_q=8, block_k=4,
                                                             **kw), q, k, v, w)
  _assert_all_close(got, want, "blockwise")


def test_blockwise_backward_has_no_txt_array():
  """The compiled gradient holds no [.., T, T] buffer (only [block, block] tiles)."""
  t = 256
  q, k, v, w = _qkv(2, 2, t=t)
  f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(w * A.blockwise_attention(
      q, k, v, block_q=32, block_k=32)), argnums=(0, 1, 2)))
  hlo = f.lower(q, k, v).compile().as_text()
  assert f"{t},{t}" not in hlo.replace(" ", "")
  ref = jax.jit(jax.grad(lambda q, k, v: jnp.sum(w * A.reference_attention(q, k, v)),
                         argnums=(0, 1, 2)))
  assert f"{t},{t}" in ref.lower(q, k, v).compile().as_text().replace(" ", "")


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("h,kvh", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_ring_matches_reference(n, causal, h, kvh):
  q, k, v, w = _qkv(h, kvh, seed=n)
  want = _out_and_grads(lambda q, k, v: A.reference_attention(q, k, v, causal=causal),
                        q, k, v, w)
  mesh = _seq_mesh(n)
  got = _out_and_grads(lambda q, k, v: A.ring_attention(q, k, v, mesh=mesh, causal=causal,
                                                        block_size=2),
                       *_shard(mesh, q, k, v, w))
  _assert_all_close(got, want, f"ring n={n} causal={causal} H={h} KVH={kvh}")
  assert got[0].sharding.spec[1] == "seq"


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_ring_layouts_with_padding_and_segments(layout):
  n, h, kvh = 4, 4, 2
  q, k, v, w = _qkv(h, kvh)
  mask = jnp.arange(T)[None, :] >= jnp.array([0, 5])[:, None]
  seg = (jnp.arange(T)[None, :] >= 11).astype(jnp.int32) * jnp.ones((B, 1), jnp.int32)
  order = A.zigzag_order(T, n) if layout == "zigzag" else np.arange(T)
  want = _out_and_grads(lambda q, k, v: A.reference_attention(
      q, k, v, causal=True, kv_mask=mask, q_segment_ids=seg, kv_segment_ids=seg), q, k, v, w)
  mesh = _seq_mesh(n)
  qz, kz, vz, wz, mz, sz = _shard(mesh, *(x[:, order] for x in (q, k, v, w, mask, seg)))
  (o, (dq, dk, dv)) = _out_and_grads(lambda q, k, v: A.ring_attention(
      q, k, v, mesh=mesh, causal=True, kv_mask=mz, segment_ids=sz, layout=layout,
      block_size=3), qz, kz, vz, wz)
  inv = np.argsort(order)
  got = (o[:, inv], (dq[:, inv], dk[:, inv], dv[:, inv]))
  _assert_all_close(got, want, f"ring layout={layout}")


def test_ring_with_batch_sharded_on_another_axis():
  """Other mesh axes stay automatic: batch over "data", sequence over "seq"."""
  q, k, v, w = _qkv(4, 2)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "seq"))
  sh = NamedSharding(mesh, P("data", "seq"))
  want = _out_and_grads(lambda q, k, v: A.reference_attention(q, k, v), q, k, v, w)
  got = _out_and_grads(lambda q, k, v: A.ring_attention(q, k, v, mesh=mesh, block_size=4),
                       *(jax.device_put(x, sh) for x in (q, k, v, w)))
  _assert_all_close(got, want, "ring with data x seq mesh")


def _shared_prefix_segments():
  """Two rows packed as the learner packs a group: a prompt (segment 0), then
  continuations 1, 2, 3 that each see the prompt and themselves, then padding (-1)."""
  seg = np.full((B, T), -1, np.int32)
  seg[0, :7], seg[0, 7:15], seg[0, 15:26], seg[0, 26:30] = 0, 1, 2, 3
  seg[1, :12], seg[1, 12:20], seg[1, 20:25] = 0, 1, 2
  return jnp.asarray(seg), jnp.asarray(seg >= 0)


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("shape,explicit", [((2, 1, 1, 4), False), ((1, 2, 2, 2), False),
                                            ((2, 1, 1, 4), True)],
                         ids=["data2_seq4", "fsdp2_tensor2_seq2", "explicit_data2_seq4"])
def test_ring_on_the_four_axis_mesh_with_shared_prefix_segments_and_padding(shape, explicit,
                                                                            mode):
  """The project's ("data", "fsdp", "tensor", "seq") mesh with the batch split over data
  and fsdp, heads over tensor: forward and gradients equal the reference with the
  learner's shared-prompt segments and padding, eagerly and under jit; also on a mesh
  of Explicit axes (`jax.make_mesh`'s default, sharding in types)."""
  from rlpt.models.sharding import MESH_AXES, make_mesh
  q, k, v, w = _qkv(4, 2, seed=7)
  seg, ok = _shared_prefix_segments()
  w = w * ok[:, :, None, None]             # padded queries carry no loss
  mesh = (jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Explicit,) * 4)
          if explicit else make_mesh(*shape))
  want = _out_and_grads(lambda q, k, v: A.reference_attention(
      q, k, v, kv_mask=ok, q_segment_ids=seg, kv_segment_ids=seg, shared_prefix=True),
      q, k, v, w)
  x_sh = NamedSharding(mesh, P("data", "seq") if explicit else
                       P(("data", "fsdp"), "seq", "tensor"))
  kv_sh = NamedSharding(mesh, P("data", "seq") if explicit else P(("data", "fsdp"), "seq"))
  qs, ws = (jax.device_put(x, x_sh) for x in (q, w))
  ks, vs = (jax.device_put(x, kv_sh) for x in (k, v))
  ring = lambda q, k, v: A.ring_attention(  # noqa: E731
      q, k, v, mesh=mesh, kv_mask=ok, segment_ids=seg, shared_prefix=True, block_size=2)
  if mode == "jit":
    got = _out_and_grads(ring, qs, ks, vs, ws)
  else:
    o, vjp = jax.vjp(ring, qs, ks, vs)
    got = (o, vjp(ws))
  mask = np.asarray(ok)[:, :, None, None]
  (go, gg), (wo, wg) = got, want
  _assert_close(np.asarray(go) * mask, np.asarray(wo) * mask, f"ring {shape} {mode} output")
  for name, a, b in zip("qkv", gg, wg):
    _assert_close(a, b, f"ring {shape} {mode} d{name}")
  block = A.blockwise_attention(q, k, v, kv_mask=ok, q_segment_ids=seg, kv_segment_ids=seg,
                                shared_prefix=True, block_q=4, block_k=4)
  _assert_close(np.asarray(block) * mask, np.asarray(wo) * mask, "blockwise shared prefix")


def test_shared_prefix_mask_is_prompt_or_own_segment():
  seg = jnp.asarray([[0, 0, 1, 1, 2, -1]])
  pos = jnp.arange(6)[None]
  m = np.asarray(A.flash.tile_mask(pos, pos, seg, seg, seg >= 0, True, True))[0]
  np.testing.assert_array_equal(m[4], [1, 1, 0, 0, 1, 0])   # continuation 2: prompt + itself
  np.testing.assert_array_equal(m[3], [1, 1, 1, 1, 0, 0])   # continuation 1: causal
  plain = np.asarray(A.flash.tile_mask(pos, pos, seg, seg, seg >= 0, True))[0]
  np.testing.assert_array_equal(plain[4], [0, 0, 0, 0, 1, 0])


def test_zigzag_order_puts_chunks_i_and_2n_minus_1_minus_i_on_device_i():
  order = A.zigzag_order(16, 4).reshape(4, 4)
  np.testing.assert_array_equal(order[0], [0, 1, 14, 15])
  np.testing.assert_array_equal(order[3], [6, 7, 8, 9])
  assert sorted(order.ravel().tolist()) == list(range(16))


def test_ring_refuses_indivisible_length_with_a_usable_message():
  mesh = _seq_mesh(4)
  q, k, v, _ = _qkv(2, 2, t=12)
  with pytest.raises(ValueError, match=r"T=12 is not divisible.*multiple of 8 \(e\.g\. T=16\)"):
    A.ring_attention(q, k, v, mesh=mesh, causal=True)
  q, k, v, _ = _qkv(2, 2, t=10)
  with pytest.raises(ValueError, match=r"multiple of 4 \(e\.g\. T=12\)"):
    A.ring_attention(q, k, v, mesh=mesh, causal=False)


def test_bad_shapes_are_refused():
  q, k, v, _ = _qkv(3, 2)
  with pytest.raises(ValueError, match="multiple of kv heads"):
    A.blockwise_attention(q, k, v)
  q, k, v, _ = _qkv(4, 2)
  with pytest.raises(ValueError, match="no 'ctx'"):
    A.ring_attention(q, k, v, mesh=_seq_mesh(2), axis_name="ctx")


def test_ring_in_a_differentiated_layer_scan_keeps_memory_linear():
  """Inside a scan over layers (as in the decoder), the loop-invariant masks must not
  be precomputed for every tile of every ring step: per-device temporaries of the
  2-layer gradient stay within a small factor of one layer's."""
  n, t = 4, 2048
  mesh = _seq_mesh(n)
  sh = NamedSharding(mesh, P(None, "seq"))
  x = jax.ShapeDtypeStruct((1, t, 4, 16), jnp.float32, sharding=sh)
  wk = jnp.full((16, 16), 0.1)

  def attn(x):
    kv = jnp.einsum("bthd,de->bthe", x[:, :, :2], wk)
    return A.ring_attention(x, kv, kv, mesh=mesh, block_size=64)

  def layers(x):
    return jax.lax.scan(lambda h, _: (h + attn(h), None), x, None, length=2)[0]

  def temp(f):
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) ** 2)))
    return g.lower(x).compile().memory_analysis().temp_size_in_bytes

  one, two = temp(attn), temp(layers)
  # Precomputed tile masks alone would be n steps x (t/n/64)^2 tiles x 64^2 x 4 heads
  # = 16 MiB here, against about 1 MiB for the linear buffers.
  assert two < 4 * one, f"2-layer scan: {two / 2**20:.1f} MiB vs one layer {one / 2**20:.1f} MiB"
