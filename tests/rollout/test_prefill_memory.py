"""The engine's prefill of a 32,768-token SmolLM2-135M prompt holds its recorded memory
(docs/benchmarks.md, "long_prefill" and "long_extraction"): compiled, not run. On one
device the blockwise prefill's temporaries stay near 1.6 GiB (a dense [T, T] prefill
compiles to 34 GiB); over a seq = 8 ring (`decode.prefill` under the learner's mesh, as
JaxEngine runs it for weights split over `seq`) each device holds 1/8 of it."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlpt.models import load_model
from rlpt.models import sharding as shd
from rlpt.rollout import decode

T = 32768
GIB = 2 ** 30


@pytest.fixture(scope="module")
def smollm2():
  model, _ = load_model("smollm2-135m-instruct")
  return model.config.replace(max_position_embeddings=40960), model.arrays()


def test_32k_prefill_on_one_device(smollm2):
  cfg, arrays = smollm2
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), arrays)
  ids = jax.ShapeDtypeStruct((1, T), jnp.int32)
  m = decode.prefill.lower(cfg, abstract, ids, ids, ids).compile().memory_analysis()
  # Measured 2026-12-06: 1.589 GiB of temporaries; the output is the prompt's keys and
  # values, 2 x 30 layers x 3 kv heads x 64 x 4 bytes a token = 1.406 GiB.
  assert m.temp_size_in_bytes / GIB <= 1.75, m.temp_size_in_bytes / GIB
  assert m.output_size_in_bytes == pytest.approx(2 * 30 * 3 * 64 * 4 * T, rel=1e-6)


def test_32k_prefill_over_a_seq8_ring(smollm2):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
  cfg, arrays = smollm2
  mesh = shd.make_mesh(seq=8)
  shardings = shd.param_shardings(cfg, mesh)
  abstract = jax.tree_util.tree_map_with_path(
      lambda path, a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shardings[
          ".".join(str(getattr(p, "key", p)) for p in path)]), arrays)
  ids = jax.ShapeDtypeStruct((1, T), jnp.int32, sharding=NamedSharding(mesh, P(None, "seq")))
  with jax.set_mesh(mesh):
    m = decode.prefill.lower(cfg, abstract, ids, ids, ids).compile().memory_analysis()
  # Measured 2026-12-06: per device 0.202 GiB of temporaries, 0.176 GiB of keys/values
  # (1/8 of the one-device output), 0.063 GiB of arguments (the weights split over seq).
  assert m.temp_size_in_bytes / GIB <= 0.25, m.temp_size_in_bytes / GIB
  assert m.output_size_in_bytes == pytest.approx(2 * 30 * 3 * 64 * 4 * T / 8, rel=0.01)
  assert m.argument_size_in_bytes / GIB <= 0.07
