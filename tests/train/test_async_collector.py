"""The asynchronous collector's consumer rules on the embedded engine (one producer
thread drives it; nothing else touches it): stale groups are dropped and counted, the
staleness gate stops generation max_staleness batches ahead, and a producer's failure
reaches the learner's thread instead of a reward."""

import time

import jax
import pytest

from configs import smoke
from rlpt.train import build as build_lib
from rlpt.train.async_collector import AsyncCollector, ProducerError
from rlpt.train.settings import Settings
from rlpt.train.workdir import prepare_workdir

G, N = 4, 8


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  c = smoke.get_config()
  c.data.prompts_per_step = G
  c.rollout.engine = "fleet"     # what async needs; the test drives the embedded engine
  c.rl.mode = "async"
  c.rl.max_staleness = 1
  c.rl.async_rounds = 1
  s = Settings.from_config(c)
  jax_c = smoke.get_config()
  jax_c.data.prompts_per_step = G
  wd = prepare_workdir(str(tmp_path_factory.mktemp("async_collector")), jax_c)
  p = build_lib.build(Settings.from_config(jax_c), wd)  # JaxEngine, tiny model
  return s, p


def _wait(pred, timeout=120.0):
  t0 = time.monotonic()
  while not pred():
    assert time.monotonic() - t0 < timeout, "timed out"
    time.sleep(0.05)


def test_stale_groups_are_dropped_counted_and_kept_for_the_record(parts):
  s, p = parts
  p.engine.update_weights(p.model.arrays(), 0)
  col = AsyncCollector(s, p.mixer, p.engine, pad_id=p.pad_id, key=jax.random.key(0))
  col.start()
  try:
    # the gate: the learner's next collect is at version 0, the engine serves 0, so
    # rounds stop when one would be taken at version 0 + max_staleness + 1
    _wait(lambda: col.counts()["buffered"] == 2 * G)
    time.sleep(0.5)
    assert col.counts() == {"generated": 2 * G, "trained": 0, "filtered": 0, "stale": 0,
                            "dead_letter": 0, "buffered": 2 * G, "in_flight": 0}
    # the learner moved on 3 versions: the buffered version-0 groups are too old
    p.engine.update_weights(p.model.arrays(), 3)
    batch = col.collect(learner_version=3)
    assert len(batch.stale) == 2 * G * N and {r.weight_version for r in batch.stale} == {0}
    assert batch.num_trained == G * N
    assert {r.weight_version for r in batch.rollouts} == {3}
    recorded, outcomes, _ = batch.recorded()
    assert outcomes.count("stale") == 2 * G * N and outcomes.count("trained") == G * N
    c = col.counts()
    assert c["stale"] == 2 * G and c["trained"] == G
    assert c["generated"] == c["trained"] + c["filtered"] + c["stale"] + c["buffered"]
    # every group id once: the stale ones are not regenerated under the same id
    ids = [r.group_id for r in recorded]
    assert len(set(ids)) == 3 * G
  finally:
    col.stop()


def test_a_producer_failure_is_raised_by_collect(parts, monkeypatch):
  s, p = parts

  def broken(requests):
    raise ConnectionError("member 0 unreachable")

  monkeypatch.setattr(p.engine, "generate", broken)
  col = AsyncCollector(s, p.mixer, p.engine, pad_id=p.pad_id, key=jax.random.key(1))
  col.start()
  try:
    with pytest.raises(ProducerError, match="member 0 unreachable"):
      col.collect(learner_version=0)
  finally:
    col.stop()
