"""The decoder on tiny random configs: KV-cache decoding equals the full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlpt.models import Decoder, KVCache, ModelConfig, forward, init_cache

_fwd = nnx.jit(lambda m, t, p, a: m(t, positions=p, attention_mask=a))


def fwd(model, tokens, positions=None, attention_mask=None):
  return np.asarray(_fwd(model, tokens, positions, attention_mask))


TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
            num_kv_heads=2, head_dim=8)


def _random_batch(rng, B, T, V, pads):
  tokens = rng.integers(0, V, size=(B, T)).astype(np.int32)
  mask = np.ones((B, T), bool)
  for b, p in enumerate(pads):
    mask[b, :p] = False
    tokens[b, :p] = 0
  return tokens, mask


@pytest.mark.parametrize("variant", [
    dict(arch="llama"),
    dict(arch="qwen2", qkv_bias=True, tie_word_embeddings=False),
    dict(arch="qwen3", qk_norm=True,
         rope_scaling=(("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
                       ("high_freq_factor", 4.0), ("original_max_position_embeddings", 16))),
])
def test_cached_decoding_equals_full_forward(variant):
  cfg = ModelConfig(**TINY, **variant)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  # Biases and norm weights start at 0/1; perturb every param so each one matters.
  leaves = nnx.state(model, nnx.Param)
  keys = iter(jax.random.split(jax.random.key(1), 64))
  nnx.update(model, jax.tree.map(lambda a: a + 0.05 * jax.random.normal(next(keys), a.shape),
                                 leaves))
  rng = np.random.default_rng(0)
  B, P, N = 3, 7, 5  # rows, prompt length (left padded), decoded tokens
  pads = [0, 3, 6]
  prompt, pmask = _random_batch(rng, B, P, cfg.vocab_size, pads)
  new = rng.integers(0, cfg.vocab_size, size=(B, N)).astype(np.int32)
  full_tokens = np.concatenate([prompt, new], 1)
  full_mask = np.concatenate([pmask, np.ones((B, N), bool)], 1)
  positions = np.maximum(np.cumsum(full_mask, 1) - 1, 0).astype(np.int32)
  want = fwd(model, full_tokens, positions, full_mask)

  step = nnx.jit(lambda m, t, p, a, c: m(t, positions=p, attention_mask=a, cache=c))
  cache = init_cache(cfg, B, P + N + 2, jnp.float32)
  assert isinstance(cache, KVCache)
  assert len(cache.k) == len(cache.v) == cfg.num_layers
  assert cache.k[0].shape == (B, cfg.num_kv_heads, P + N + 2, cfg.head_dim)
  logits, cache = step(model, prompt, positions[:, :P], pmask, cache)
  # A cache-free prefill's keys/values (what JaxEngine copies into its cache) are the
  # ones the cached call stored.
  _, (pk, pv) = forward(cfg, model.arrays(), prompt, positions=positions[:, :P],
                        attention_mask=pmask, return_kv=True)
  assert pk.shape == (cfg.num_layers, B, P, cfg.num_kv_heads, cfg.head_dim)
  for i in range(cfg.num_layers):
    for a, b in ((pk[i], cache.k[i]), (pv[i], cache.v[i])):
      np.testing.assert_allclose(np.asarray(b)[:, :, :P].transpose(0, 2, 1, 3)[pmask],
                                 np.asarray(a)[pmask], atol=1e-5)
  with pytest.raises(ValueError, match="return_kv is for cache-free passes"):
    forward(cfg, model.arrays(), prompt, cache=cache, return_kv=True)
  got = [np.asarray(logits)]
  for t in range(N - 1):  # feed decoded token t, predict t+1
    logits, cache = step(model, new[:, t:t + 1], positions[:, P + t:P + t + 1],
                         np.ones((B, 1), bool), cache)
    got.append(np.asarray(logits))
  got = np.concatenate(got, 1)
  T = P + N - 1
  valid = full_mask[:, :T]
  np.testing.assert_allclose(got[valid], want[:, :T][valid], atol=2e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.index), np.full(B, T))
  np.testing.assert_array_equal(np.asarray(cache.valid)[:, :T], valid)
  assert not np.asarray(cache.valid)[:, T:].any()
  # The default positions (count of earlier real tokens) reproduce the explicit ones.
  np.testing.assert_allclose(fwd(model, full_tokens, None, full_mask)[full_mask],
                             want[full_mask], atol=1e-6)


def test_padding_does_not_leak_and_rows_are_independent():
  cfg = ModelConfig(**TINY)
  model = Decoder(cfg, rngs=nnx.Rngs(3))
  rng = np.random.default_rng(1)
  toks = rng.integers(1, cfg.vocab_size, size=(1, 6)).astype(np.int32)
  alone = fwd(model, toks)
  padded = np.concatenate([np.full((1, 4), 5, np.int32), toks], 1)
  mask = np.concatenate([np.zeros((1, 4), bool), np.ones((1, 6), bool)], 1)
  out = fwd(model, padded, None, mask)
  np.testing.assert_allclose(out[:, 4:], alone, atol=2e-5)
  # Changing a pad token changes nothing.
  padded2 = padded.copy()
  padded2[0, :4] = 11
  np.testing.assert_allclose(fwd(model, padded2, None, mask)[:, 4:], out[:, 4:],
                             atol=1e-6)


def test_bf16_compute_close_to_fp32_and_params_stay_fp32():
  cfg = ModelConfig(**TINY)
  m32 = Decoder(cfg, rngs=nnx.Rngs(0))
  m16 = Decoder(cfg.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(nnx.state(m16, nnx.Param)))
  toks = np.arange(12, dtype=np.int32).reshape(2, 6)
  a, b = fwd(m32, toks), fwd(m16, toks)
  assert b.dtype == np.float32
  assert np.abs(a - b).max() < 0.05 * np.abs(a).max() + 1e-3
  assert np.abs(a - b).max() > 0  # bf16 really was used


def test_remat_gives_same_gradients():
  cfg = ModelConfig(**TINY)
  toks = np.arange(12, dtype=np.int32).reshape(2, 6) % cfg.vocab_size

  def grads(c):
    model = Decoder(c, rngs=nnx.Rngs(0))
    return nnx.jit(nnx.grad(lambda m: jnp.mean(m(toks) ** 2)))(model)

  g0, g1 = grads(cfg), grads(cfg.replace(remat=True))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), g0, g1)


def test_bad_config_errors():
  with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
    ModelConfig(arch="gpt2")
  with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
    ModelConfig(rope_scaling=(("rope_type", "yarn"), ("factor", 2.0)))
  with pytest.raises(ValueError, match="not a multiple"):
    ModelConfig(num_heads=3, num_kv_heads=2)


def test_mlp_backward_equals_autodiff():
  # decoder._mlp's hand-written backward against autodiff of the same expression.
  from rlpt.models import decoder
  ks = jax.random.split(jax.random.key(7), 5)
  h = jax.random.normal(ks[0], (2, 5, 16))
  wg, wu = 0.3 * jax.random.normal(ks[1], (16, 24)), 0.3 * jax.random.normal(ks[2], (16, 24))
  wd = 0.3 * jax.random.normal(ks[3], (24, 16))
  dy = jax.random.normal(ks[4], (2, 5, 16))

  def plain(h, wg, wu, wd):
    return (jax.nn.silu(h @ wg) * (h @ wu)) @ wd

  ours = jax.vjp(lambda *a: decoder._mlp(*a, jnp.float32), h, wg, wu, wd)
  ref = jax.vjp(plain, h, wg, wu, wd)
  np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)
  for a, b in zip(ours[1](dy), ref[1](dy)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [200, 256])
def test_causal_query_blocks_equal_one_block(T, monkeypatch):
  # The cache-free attention runs the causal T x T scores as a lower block triangle
  # (rlpt.ops.dense_attention.causal_attention); with packed segments, left padding and gradients it must
  # compute what the single-block attention does at every real token.
  from rlpt.ops import dense_attention
  cfg = ModelConfig(**TINY)
  model = Decoder(cfg, rngs=nnx.Rngs(5))
  params = model.arrays()
  rng = np.random.default_rng(2)
  tokens, mask = _random_batch(rng, 2, T, cfg.vocab_size, [0, 37])
  seg = np.ones((2, T), np.int32)
  seg[0, :70], seg[0, 130:] = 0, 2          # row 0: shared prefix, then two continuations
  seg[1, :37] = -1                          # row 1: left padding
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
  pos[0, 130:] = 70 + np.arange(T - 130)    # continuation 2 restarts after the prefix

  def run():
    def loss(p):
      h = forward(cfg, p, tokens, positions=pos, attention_mask=mask, segment_ids=seg)
      return jnp.sum(jnp.where(mask[..., None], jnp.tanh(h), 0.0)), h
    (_, h), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(h), g

  h_blocks, g_blocks = run()
  assert dense_attention.causal_blocks(T) >= 3
  monkeypatch.setattr(dense_attention, "CAUSAL_MAX_BLOCKS", 1)
  h_one, g_one = run()
  np.testing.assert_allclose(h_blocks[mask], h_one[mask], atol=2e-6, rtol=1e-6)
  # float32 summation order only: within 2e-6 of each gradient's largest entry (some
  # are several hundred: sums over the 2 x T tokens)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, atol=2e-6 * float(np.abs(b).max()), rtol=0), g_blocks, g_one)


@pytest.mark.parametrize("variant", [dict(arch="llama"),
                                     dict(arch="qwen2", qkv_bias=True, tie_word_embeddings=False)])
def test_unstacked_layers_give_identical_cached_steps(variant):
  """`unstack_layers` (JaxEngine's decode weights: per-layer arrays, projections split
  into `projections.proj`'s CPU row blocks) computes the same cached steps (bit for bit for the
  Llama layout that SmolLM2 uses)."""
  from rlpt.models import projections
  cfg = ModelConfig(vocab_size=97, hidden_size=384, intermediate_size=768, num_layers=2,
                    num_heads=6, num_kv_heads=2, head_dim=64, **variant)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  params = model.arrays()
  unstacked = projections.unstack_layers(params)
  layers = unstacked["layers"]
  assert isinstance(layers, tuple) and len(layers) == cfg.num_layers
  # 384-term contractions in 2 blocks of 192, the 768-term down projection in 4.
  assert [b.shape for b in layers[1]["wq"]] == [(192, 6, 64)] * 2
  assert [b.shape for b in layers[1]["wo"]] == [(3, 64, 384)] * 2
  assert [b.shape for b in layers[1]["w_down"]] == [(192, 384)] * 4
  np.testing.assert_array_equal(np.concatenate(layers[1]["w_up"]), params["layers"]["w_up"][1])
  np.testing.assert_array_equal(layers[0]["attn_norm"], params["layers"]["attn_norm"][0])
  with pytest.raises(ValueError, match="per-layer weights .* are for calls with a cache"):
    forward(cfg, unstacked, jnp.zeros((1, 3), jnp.int32))

  rng = np.random.default_rng(0)
  B, P = 3, 6
  prompt, pmask = _random_batch(rng, B, P, cfg.vocab_size, [0, 2, 5])
  step = jax.jit(lambda p, t, a, c: forward(cfg, p, t, attention_mask=a, cache=c))
  outs = []
  for p in (params, unstacked):
    cache = init_cache(cfg, B, P + 4, jnp.float32)
    logits, cache = step(p, prompt, pmask, cache)
    got = [np.asarray(logits)]
    tok = jnp.argmax(logits[:, -1:], -1).astype(jnp.int32)
    for _ in range(3):
      logits, cache = step(p, tok, jnp.ones((B, 1), bool), cache)
      got.append(np.asarray(logits))
      tok = jnp.argmax(logits, -1).astype(jnp.int32)
    outs.append((np.concatenate(got, 1), cache))
  if cfg.qkv_bias:
    # XLA fuses the bias adds differently around the two loops: float32 rounding only.
    check = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)  # noqa: E731
  else:
    check = np.testing.assert_array_equal
  check(outs[1][0], outs[0][0])
  for a, b in zip(outs[0][1].k + outs[0][1].v, outs[1][1].k + outs[1][1].v):
    check(np.asarray(b), np.asarray(a))


def test_accelerator_dots_trace_one_plain_dot_where_the_cpu_blocks():
  """The CPU parity blocking (`projections.proj`: contractions in blocks of <= 192 terms)
  is not what an accelerator runs; under `accelerator_dots()` the same projection traces
  one plain dot, so a memory plan compiled on CPU describes the accelerator's program."""
  from rlpt.models import projections
  x = jnp.ones((2, 3, 768), jnp.float32)
  w = jnp.ones((768, 64), jnp.float32)
  def f(x, w):
    return projections.proj(x, w, "btd,df->btf", jnp.float32)

  def dots(fn):  # a fresh function each time: traces are cached per function
    return str(jax.make_jaxpr(lambda x, w: fn(x, w))(x, w)).count("dot_general")

  assert projections.cpu_blocking() and dots(f) == 4        # 768 terms = 4 blocks of 192
  with projections.accelerator_dots():
    assert not projections.cpu_blocking() and dots(f) == 1
    np.testing.assert_allclose(f(x, w), jnp.einsum("btd,df->btf", x, w), rtol=1e-6)
  assert projections.cpu_blocking()                          # restored on exit


def test_long_cache_free_passes_attend_blockwise_with_the_dense_result(monkeypatch):
  """At T >= blockwise_from the cache-free forward attends in tiles (no [T, T] scores);
  with packed prompts and shared-prefix segments, padding and return_kv it computes
  what the dense path does, and its hidden states and gradients match."""
  from rlpt.models import decoder as dec
  monkeypatch.setattr(dec, "BLOCKWISE_TILE", 16)   # several tiles at this length
  cfg = ModelConfig(**TINY, blockwise_from=0)
  params = Decoder(cfg, rngs=nnx.Rngs(3)).arrays()
  rng = np.random.default_rng(0)
  T = 40
  tokens = jnp.asarray(rng.integers(0, 97, size=(2, T)).astype(np.int32))
  seg = np.full((2, T), -1, np.int32)
  seg[0, :9], seg[0, 9:20], seg[0, 20:33] = 0, 1, 2      # prompt + two continuations
  seg[1, :14], seg[1, 14:30] = 1, 2                      # two packed prompts (prefill)
  pos = np.zeros((2, T), np.int32)
  pos[0, :20] = np.arange(20)
  pos[0, 20:33] = 9 + np.arange(13)
  pos[1, :14], pos[1, 14:30] = np.arange(14), np.arange(16)
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  real = np.asarray(seg >= 0)[..., None]

  def run(c):
    def f(p):
      h, kv = forward(c, p, tokens, positions=pos, segment_ids=seg, return_hidden=True,
                      return_kv=True)
      return jnp.sum(h * jnp.asarray(real)), (h, kv)
    (_, (h, kv)), g = jax.value_and_grad(f, has_aux=True)(params)
    return h, kv, g

  h0, kv0, g0 = run(cfg)
  h1, kv1, g1 = run(cfg.replace(blockwise_from=32))
  np.testing.assert_allclose(np.asarray(h1) * real, np.asarray(h0) * real, atol=2e-5)
  kv_real = real[None, ..., None]         # [L, B, T, K, Dh]: padding rows hold junk
  for a, b in zip(kv0, kv1):
    np.testing.assert_allclose(np.asarray(b) * kv_real, np.asarray(a) * kv_real, atol=2e-5)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4, rtol=1e-4)
  lowered = jax.jit(lambda p: forward(cfg.replace(blockwise_from=32), p, tokens, positions=pos,
                                      segment_ids=seg)).lower(params).as_text()
  assert f"{T}x{T}" not in lowered   # no [T, T] score or mask array


def test_bf16_dots_are_emulated_on_cpu_and_plain_bf16_for_an_accelerator():
  """On XLA:CPU a bf16 dot operand is rounded to bf16 and widened to fp32 (its runtime has
  no unfused bf16 x bf16 -> fp32 dot, which the backward pass needs); the product of two
  bf16 values is exact in fp32, so the emulated dot equals the bf16 dot summed in fp32.
  Under `accelerator_dots()` the dot is traced with bf16 operands."""
  from rlpt.ops import dots
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(4, 64)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(64, 8)), jnp.float32)
  xo, wo = dots.dot_operand(x, jnp.bfloat16), dots.dot_operand(w, jnp.bfloat16)
  assert xo.dtype == jnp.float32 and dots.emulates_bf16(jnp.bfloat16)
  np.testing.assert_array_equal(xo, x.astype(jnp.bfloat16).astype(jnp.float32))
  want = np.asarray(xo, np.float64) @ np.asarray(wo, np.float64)   # exact products
  np.testing.assert_allclose(xo @ wo, want, rtol=1e-5, atol=1e-5)
  assert not dots.emulates_bf16(jnp.float32)
  np.testing.assert_array_equal(dots.dot_operand(x, jnp.float32), x)
  with dots.accelerator_dots():
    assert dots.dot_operand(x, jnp.bfloat16).dtype == jnp.bfloat16
    jaxpr = str(jax.make_jaxpr(lambda a: dots.dot_operand(a, jnp.bfloat16) @ w.astype(
        jnp.bfloat16))(x))
    assert "bf16[4,8]" in jaxpr or "bf16[4,64]" in jaxpr


def test_bf16_gradients_run_on_cpu_and_stay_near_fp32():
  """A bf16 forward + backward of the decoder runs on XLA:CPU (it failed with "Unsupported
  element type for DotThunk::Execute: BF16 x BF16 = F32" before the emulation) and its
  gradients, in the fp32 parameters' dtype, are within bf16's precision of fp32's."""
  cfg = ModelConfig(**TINY)
  toks = np.arange(24, dtype=np.int32).reshape(2, 12) % cfg.vocab_size

  def grads(c):
    model = Decoder(c, rngs=nnx.Rngs(0))
    return nnx.jit(nnx.grad(lambda m: jnp.mean(jax.nn.log_softmax(m(toks)) ** 2)))(model)

  g32 = jax.tree.leaves(nnx.state(grads(cfg), nnx.Param))
  g16 = jax.tree.leaves(nnx.state(grads(cfg.replace(dtype="bfloat16")), nnx.Param))
  for a, b in zip(g32, g16):
    assert b.dtype == jnp.float32
    err = float(jnp.linalg.norm(a - b) / (jnp.linalg.norm(a) + 1e-12))
    assert 0 < err < 0.05, err        # bf16 was really used, and is close


@pytest.mark.parametrize("variant", [dict(arch="llama"),
                                     dict(arch="qwen2", qkv_bias=True, tie_word_embeddings=False)])
def test_the_compiled_decode_layout_is_the_eager_one_cast(variant):
  """`unstack_layers_jit` (what a weight swap runs: one compiled program per layer) gives
  the arrays of `unstack_layers` after casting the projections (and an untied head) to
  the compute dtype, bit for bit, in the same tree; norms and biases stay float32."""
  from rlpt.models import projections
  cfg = ModelConfig(vocab_size=97, hidden_size=384, intermediate_size=768, num_layers=3,
                    num_heads=6, num_kv_heads=2, head_dim=64, **variant)
  params = Decoder(cfg, rngs=nnx.Rngs(1)).arrays()
  for dt in (None, jnp.bfloat16):
    want = projections.unstack_layers(projections.cast_projections(params, dt))
    got = projections.unstack_layers_jit(params, dt)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    assert got["layers"][2]["attn_norm"].dtype == jnp.float32
    assert got["layers"][2]["wq"][0].dtype == (jnp.float32 if dt is None else dt)
    if "lm_head" in params:
      assert got["lm_head"].dtype == (jnp.float32 if dt is None else dt)
