"""WeightSync's staged syncs (`wait=False`, the async loop): host copy on the caller's
thread, publish + load in the background in version order, at most `max_behind`
unfinished, failures raised by `wait`; on the embedded engine loading Orbax versions."""

import jax
import numpy as np
import pytest

from configs import smoke
from rlpt.train import build as build_lib
from rlpt.train.publish import WeightPublisher, published_versions
from rlpt.train.settings import Settings
from rlpt.train.weight_sync import WeightSync
from rlpt.train.workdir import prepare_workdir


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  c = smoke.get_config()
  wd = prepare_workdir(str(tmp_path_factory.mktemp("weight_sync")), c)
  return build_lib.build(Settings.from_config(c), wd)


def _scaled(params, k):
  return jax.tree.map(lambda x: np.asarray(x) * k, params)


def test_staged_syncs_load_in_order_and_wait_finishes_them(parts, tmp_path):
  engine = parts.engine
  base = parts.model.arrays()
  sync = WeightSync(engine, publisher=WeightPublisher(str(tmp_path), keep=2), max_behind=2)
  sync.sync(base, 0)
  for v in (1, 2, 3):
    sync.sync(_scaled(base, 1 + v / 10), v, wait=False)
    assert len(sync._staged) <= 2
  sync.wait()
  assert engine.weight_version == 3 and not sync._staged
  assert published_versions(str(tmp_path)) == [2, 3]
  got = jax.tree.leaves(engine._params)
  want = jax.tree.leaves(_scaled(base, 1.3))
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)
  with pytest.raises(ValueError, match="versions only move forward"):
    sync.sync(base, 2, wait=False)


def test_a_failed_staged_load_is_raised_and_the_engine_keeps_its_version(parts, tmp_path):
  engine = parts.engine
  base = parts.model.arrays()
  sync = WeightSync(engine, publisher=WeightPublisher(str(tmp_path), keep=2))
  sync.sync(base, 10)
  bad = jax.tree.map(lambda x: np.zeros((3,), np.float32), base)  # wrong shapes
  sync.sync(bad, 11, wait=False)
  with pytest.raises(ValueError, match="has shape"):
    sync.wait()
  assert engine.weight_version == 10
