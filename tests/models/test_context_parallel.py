"""Context parallelism: under a mesh whose "seq" axis is > 1 the decoder's attention
is ring attention, and its logits and loss gradients equal the unsharded model."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlpt.models import Decoder, ModelConfig, forward

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True,
                  tie_word_embeddings=False)
B, T = 2, 32


def _params_and_batch():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  keys = iter(jax.random.split(jax.random.key(1), 64))
  params = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(next(keys), a.shape),
                        model.arrays())
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, size=(B, T)).astype(np.int32)
  mask = np.ones((B, T), bool)
  mask[1, :5] = False  # row 1 is left-padded
  tokens[1, :5] = 0
  return params, jnp.asarray(tokens), jnp.asarray(mask)


def _loss(params, tokens, mask):
  """Mean next-token NLL over real tokens."""
  logits = forward(CFG, params, tokens, attention_mask=mask)
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  w = (mask[:, 1:] & mask[:, :-1]).astype(jnp.float32)
  return jnp.sum(nll * w) / jnp.sum(w), logits


def _run(params, tokens, mask):
  return jax.jit(jax.value_and_grad(_loss, has_aux=True))(params, tokens, mask)


def _rel(a, b):
  a, b = np.asarray(a), np.asarray(b)
  return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def test_seq_sharded_model_equals_unsharded():
  params, tokens, mask = _params_and_batch()
  (loss0, logits0), grads0 = _run(params, tokens, mask)
  for shape in [(2, 1, 1, 4), (1, 1, 1, 8)]:
    mesh = Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape),
                ("data", "fsdp", "tensor", "seq"))
    seq = NamedSharding(mesh, P("data", "seq"))
    with jax.set_mesh(mesh):
      jaxpr = str(jax.make_jaxpr(lambda p, t, m: _loss(p, t, m)[0])(params, tokens, mask))
      assert "ppermute" in jaxpr, f"mesh {shape}: the model did not use ring attention"
      (loss1, logits1), grads1 = _run(params, jax.device_put(tokens, seq),
                                      jax.device_put(mask, seq))
    np.testing.assert_allclose(float(loss1), float(loss0), rtol=1e-5)
    real = np.asarray(mask)  # padding queries see no key: ring gives 0, dense gives junk
    assert _rel(np.asarray(logits1)[real], np.asarray(logits0)[real]) < 1e-5
    for path, g1, g0 in zip(jax.tree_util.tree_leaves_with_path(grads1),
                            jax.tree.leaves(grads1), jax.tree.leaves(grads0)):
      assert _rel(g1, g0) < 1e-5, f"mesh {shape}: grad {jax.tree_util.keystr(path[0])}"


def test_without_seq_axis_the_model_stays_dense():
  params, tokens, mask = _params_and_batch()
  mesh = Mesh(np.array(jax.devices()[:2]).reshape(2, 1, 1, 1), ("data", "fsdp", "tensor", "seq"))
  with jax.set_mesh(mesh):
    jaxpr = str(jax.make_jaxpr(lambda p, t, m: _loss(p, t, m)[0])(params, tokens, mask))
  assert "ppermute" not in jaxpr
