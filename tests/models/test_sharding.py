"""Sharding on 8 fake CPU devices (data=2, fsdp=2, tensor=2): parameters are created and
loaded straight into their shardings, and the sharded forward and gradients equal the
single-device ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from rlpt.models import ModelConfig, init_cache, load_model, random_model, token_logprobs
from rlpt.models.hf_checkpoint import save_hf
from rlpt.models.sharding import (LOGICAL_RULES, cache_shardings, logical_to_spec, make_mesh)
from rlpt.models.tokenizer import Tokenizer

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True,
                  tie_word_embeddings=False, arch="qwen2")


@pytest.fixture(scope="module")
def mesh():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
  return make_mesh(data=2, fsdp=2, tensor=2)


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, size=(4, 10)).astype(np.int32)
  mask = np.ones((4, 10), bool)
  mask[1, :3] = False
  mask[3, :6] = False
  return tokens, mask


def test_rules_table_and_specs(mesh):
  assert set(LOGICAL_RULES) >= {"batch", "embed", "heads", "kv", "mlp", "vocab", "length"}
  assert logical_to_spec(("layers", "embed", "heads", "kv"), (2, 32, 4, 8), mesh) == \
      P(None, "fsdp", "tensor", None)
  assert logical_to_spec(("batch", "length"), (4, 10), mesh) == P(("data", "fsdp"), None)
  # A mesh axis that does not divide the dimension is dropped (SmolLM2: 9 heads, tensor=2).
  assert logical_to_spec(("embed", "heads", "kv"), (576, 9, 64), mesh) == P("fsdp", None, None)
  # A mesh axis is used once per array.
  assert logical_to_spec(("embed", "embed"), (32, 32), mesh) == P("fsdp", None)
  # Parameters are split over "seq" too (one copy of the model per ring, not per member),
  # after "fsdp"; activations' "length" takes "seq" first.
  ring = make_mesh(data=2, seq=4)
  assert logical_to_spec(("layers", "embed", "heads", "kv"), (2, 32, 4, 8), ring) == \
      P(None, "seq", None, None)
  assert logical_to_spec(("embed",), (32,), make_mesh(fsdp=2, seq=4)) == P(("fsdp", "seq"))
  assert logical_to_spec(("batch", "length", "embed"), (4, 8, 32), ring) == \
      P("data", "seq", None)


def test_params_created_in_their_shardings_without_full_replicas(mesh):
  model = random_model(CFG, seed=0, mesh=mesh)
  ref = random_model(CFG, seed=0)
  jax.tree.map(np.testing.assert_array_equal, ref.arrays(), model.arrays())
  wq = model.layers.wq[...]
  assert wq.sharding.spec == P(None, "fsdp", "tensor", None)
  # Each device holds a quarter of wq (fsdp x tensor), never the whole array.
  assert {s.data.shape for s in wq.addressable_shards} == {(2, 16, 2, 8)}
  assert model.embed[...].sharding.spec == P("tensor", "fsdp")
  assert model.lm_head[...].sharding.spec == P("fsdp", "tensor")


def test_sharded_forward_and_grads_equal_single_device(mesh):
  single = random_model(CFG, seed=1)
  sharded = random_model(CFG, seed=1, mesh=mesh)
  tokens, mask = _batch()
  bs = NamedSharding(mesh, P(("data", "fsdp"), None))
  t_s, m_s = jax.device_put(tokens, bs), jax.device_put(mask, bs)

  fwd = nnx.jit(lambda m, t, a: m(t, attention_mask=a))
  want = np.asarray(fwd(single, tokens, mask))
  got = fwd(sharded, t_s, m_s)
  assert len(got.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(got)[mask], want[mask], atol=1e-5, rtol=1e-5)

  def loss(m, t, a):
    return -jnp.sum(token_logprobs(m, t, a, attention_mask=a, chunk_size=4)) / a.sum()

  grad = nnx.jit(nnx.grad(loss))
  g_want = grad(single, tokens, mask)
  g_got = grad(sharded, t_s, m_s)
  assert g_got["layers"]["wq"][...].sharding.is_equivalent_to(sharded.layers.wq[...].sharding, 4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                       atol=1e-5, rtol=1e-5), g_got, g_want)


def test_sharded_cached_decoding_and_sharded_load(mesh, tmp_path):
  model = random_model(CFG, seed=2)
  tok = Tokenizer.from_gguf_metadata(
      {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [chr(0x21 + i) for i in range(90)],
       "tokenizer.ggml.merges": []}, source="test")
  save_hf(model, tok, str(tmp_path))
  loaded, _ = load_model(str(tmp_path), mesh=mesh)
  assert loaded.layers.w_up[...].sharding.spec == P(None, "fsdp", "tensor")
  assert {s.data.shape for s in loaded.layers.w_up[...].addressable_shards} == {(2, 16, 24)}
  jax.tree.map(np.testing.assert_array_equal, model.arrays(), loaded.arrays())

  tokens, mask = _batch()
  step = nnx.jit(lambda m, t, a, c: m(t, attention_mask=a, cache=c))
  want, _ = step(model, tokens, mask, init_cache(CFG, 4, 16))
  cache = init_cache(CFG, 4, 16, sharding=cache_shardings(CFG, 4, 16, mesh))
  assert len(cache.k) == CFG.num_layers
  assert cache.k[0].sharding.spec == P(("data", "fsdp"), "tensor", None, None)
  got, cache = step(loaded, tokens, mask, cache)
  np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(want)[mask], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.index), np.full(4, 10))
