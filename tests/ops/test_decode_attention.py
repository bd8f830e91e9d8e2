"""rlpt.ops.decode_attention: the C++ CPU kernel against its XLA reference, that it
reads nothing past a row's length, the decoder with and without it, and build errors."""

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpt.models import decoder, loading
from rlpt.ops import decode_attention as da


def _inputs(B, K, G, S, D, seed=0, lengths=None):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, K, G, D), np.float32) * 2
  k = rng.standard_normal((B, K, S, D), np.float32)
  v = rng.standard_normal((B, K, S, D), np.float32)
  valid = rng.random((B, S)) < 0.85
  valid[:, :2] = True
  if lengths is None:
    lengths = rng.integers(0, S + 3, B)  # > S: clamped to S
  return q, k, v, valid, np.asarray(lengths, np.int32)


def _both(q, k, v, valid, length, scale):
  args = [jnp.asarray(x) for x in (q, k, v, valid, length)]
  got = jax.jit(lambda *a: da.cache_attention(*a, scale))(*args)
  want = jax.jit(lambda *a: da.cache_attention_reference(*a, scale))(*args)
  return [np.asarray(x) for x in got], [np.asarray(x) for x in want]


def test_kernel_is_built_here():
  # make setup installs g++; without it every other test here would only compare
  # the XLA path with itself.
  assert da.kernel_available(), "the CPU kernel did not build (see the logged warning)"
  assert da.library_path().exists()


# (G, Dh): the specialised SmolLM2 / Qwen / Llama shapes and two generic ones.
@pytest.mark.parametrize("G,D", [(3, 64), (1, 64), (4, 64), (2, 128), (4, 128), (7, 64), (3, 40)])
def test_kernel_equals_reference(G, D):
  B, K, S = 6, 2, 70
  q, k, v, valid, length = _inputs(B, K, G, S, D, seed=G * 100 + D,
                                   lengths=[0, 1, 17, 64, 70, 73])
  (m, z, o), (m_r, z_r, o_r) = _both(q, k, v, valid, length, 1 / math.sqrt(D))
  assert m.shape == (B, K, G) and z.shape == (B, K, G) and o.shape == (B, K, G, D)
  np.testing.assert_allclose(m, m_r, rtol=1e-6, atol=1e-5)
  np.testing.assert_allclose(z, z_r, rtol=1e-5)
  np.testing.assert_allclose(o, o_r, rtol=1e-5, atol=1e-5)
  # Row 0 reads nothing: no weight in the merge.
  np.testing.assert_array_equal(m[0], np.float32(-1e30))
  np.testing.assert_array_equal(z[0], 0.0)
  np.testing.assert_array_equal(o[0], 0.0)
  # The normalised attention (what the model uses) agrees closely too.
  live = z_r > 0
  np.testing.assert_allclose((o / np.where(live, z, 1)[..., None])[live],
                             (o_r / np.where(live, z_r, 1)[..., None])[live], atol=2e-6)


def test_reads_only_the_rows_own_slots():
  """Slots at or past a row's length and invalid slots are never read: NaN there
  leaves the kernel's output equal to the reference on clean data."""
  B, K, G, S, D = 4, 3, 3, 96, 64
  q, k, v, valid, length = _inputs(B, K, G, S, D, seed=7, lengths=[5, 40, 96, 0])
  want = _both(q, k, v, valid, length, 0.125)[1]
  k_bad, v_bad = k.copy(), v.copy()
  for b in range(B):
    k_bad[b, :, length[b]:] = np.nan
    v_bad[b, :, length[b]:] = np.nan
    k_bad[b, :, ~valid[b]] = np.nan
    v_bad[b, :, ~valid[b]] = np.nan
  args = [jnp.asarray(x) for x in (q, k_bad, v_bad, valid, length)]
  got = jax.jit(lambda *a: da.cache_attention(*a, 0.125))(*args)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


def test_large_batch_uses_the_thread_pool_consistently():
  """Many (row, KV head) items, claimed by several threads: same result each call."""
  q, k, v, valid, length = _inputs(64, 3, 3, 384, 64, seed=3)
  (m, z, o), (m_r, z_r, o_r) = _both(q, k, v, valid, length, 0.125)
  np.testing.assert_allclose(o, o_r, rtol=1e-5, atol=1e-5)
  again = jax.jit(lambda *a: da.cache_attention(*a, 0.125))(
      *[jnp.asarray(x) for x in (q, k, v, valid, length)])
  np.testing.assert_array_equal(np.asarray(again[2]), o)


CFG = decoder.ModelConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_layers=3,
                          num_heads=6, num_kv_heads=2, head_dim=16)


def test_decoder_cached_step_with_and_without_kernel():
  """One-token steps over a partly filled cache (left padding, ragged lengths): the
  kernel path gives the XLA path's logits and the same updated cache."""
  model = loading.random_model(CFG, seed=1)
  params = model.arrays()
  B, S, P = 4, 24, 9
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, P)), jnp.int32)
  mask = jnp.asarray(np.arange(P)[None] >= np.array([0, 3, 5, 8])[:, None])  # left padding

  def run(use_kernel):
    cfg = CFG.replace(decode_kernel=use_kernel)
    cache = decoder.init_cache(cfg, B, S)
    _, cache = jax.jit(lambda p, c: decoder.forward(cfg, p, prompt, attention_mask=mask,
                                                    cache=c))(params, cache)
    step = jax.jit(lambda p, t, c: decoder.forward(cfg, p, t, cache=c))
    tok, outs = prompt[:, -1:], []
    for _ in range(5):
      logits, cache = step(params, tok, cache)
      outs.append(np.asarray(logits[:, 0]))
      tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return np.stack(outs), cache

  got, c1 = run(True)
  want, c2 = run(False)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(c1.k[-1]), np.asarray(c2.k[-1]), atol=2e-5)
  np.testing.assert_array_equal(np.asarray(c1.index), np.asarray(c2.index))


def test_failed_build_says_why(monkeypatch, tmp_path):
  monkeypatch.setenv("RLPT_KERNEL_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "false")
  with pytest.raises(da.KernelBuildError, match=r"false .*decode_attention\.cc.* failed \(exit 1\)"):
    da.build()
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
  with pytest.raises(da.KernelBuildError, match="could not run"):
    da.build()
  assert not list(tmp_path.glob("*.so"))  # no half-written library left behind


def test_without_a_compiler_the_xla_path_runs(tmp_path):
  """A process that cannot build the kernel warns once and computes the same numbers."""
  code = (
      "import jax, jax.numpy as jnp, numpy as np\n"
      "from rlpt.ops import decode_attention as da\n"
      "assert not da.kernel_available()\n"
      "q = jnp.ones((1, 1, 2, 8)); k = jnp.arange(32.).reshape(1, 1, 4, 8) / 32\n"
      "m, z, o = da.cache_attention(q, k, k, jnp.ones((1, 4), bool), jnp.array([3]), 0.5)\n"
      "r = da.cache_attention_reference(q, k, k, jnp.ones((1, 4), bool), jnp.array([3]), 0.5)\n"
      "np.testing.assert_allclose(o, r[2])\n"
      "print('ok')\n")
  env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), RLPT_KERNEL_DIR=str(tmp_path))
  res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == "ok"
  assert "decode-attention kernel unavailable, using the XLA path" in res.stderr
  assert "no-such-compiler" in res.stderr
