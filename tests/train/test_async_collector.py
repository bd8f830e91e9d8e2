"""The asynchronous collector's consumer rules on the embedded engine (one producer
thread drives it; nothing else touches it): stale groups are dropped and counted, the
staleness gate stops generation max_staleness batches ahead (further ahead when
dynamic sampling drops most groups) and draws nothing for after the last step, and a
producer's failure reaches the learner's thread instead of a reward."""

import dataclasses
import itertools
import time
import zlib

import jax
import pytest

from configs import smoke
from rlpt.rewards import registry
from rlpt.train import build as build_lib
from rlpt.train.async_collector import AsyncCollector, ProducerError, collects_ahead
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


def test_collects_ahead_counts_whole_batches_without_dynamic_sampling():
  # keep = 1: the group at position p (counted from the next to leave the buffer) is
  # taken (kept + p) // G collects after the current one, whatever the budget
  for G, kept, p in itertools.product((1, 4, 12), range(0, 4), range(0, 40)):
    if kept >= G:
      continue
    assert collects_ahead(p, kept=kept, consumed=kept, prompts_per_step=G, budget=G,
                          keep=1.0) == (kept + p) // G


def test_collects_ahead_with_dynamic_sampling_and_the_budget():
  # a third of the groups kept: a collect of 12 takes 36
  assert [collects_ahead(p, kept=0, consumed=0, prompts_per_step=12, budget=48,
                         keep=1 / 3) for p in (0, 35, 36, 71, 72)] == [0, 0, 1, 1, 2]
  # one kept of 10 taken so far: 33 more to take in this collect
  assert [collects_ahead(p, kept=1, consumed=10, prompts_per_step=12, budget=48,
                         keep=1 / 3) for p in (32, 33, 68, 69)] == [0, 1, 1, 2]
  # a tenth kept: the refill budget (48 a collect) ends each collect first
  assert [collects_ahead(p, kept=2, consumed=40, prompts_per_step=12, budget=48,
                         keep=0.1) for p in (7, 8, 55, 56)] == [0, 1, 1, 2]
  # no group kept at all still moves on by the budget
  assert collects_ahead(100, kept=0, consumed=0, prompts_per_step=12, budget=48,
                        keep=0.0) == 2


def test_no_round_is_drawn_for_after_the_last_step(parts):
  s, p = parts
  s = dataclasses.replace(s, total_steps=2)   # collects at versions 0 and 1
  p.engine.update_weights(p.model.arrays(), 0)
  col = AsyncCollector(s, p.mixer, p.engine, pad_id=p.pad_id, key=jax.random.key(2))
  col.start()
  try:
    _wait(lambda: col.counts()["buffered"] == 2 * G)
    col.collect(learner_version=0)
    p.engine.update_weights(p.model.arrays(), 1)
    time.sleep(1.0)   # the gate is open for staleness; only the run's end holds it
    assert col.counts()["generated"] == 2 * G and col.counts()["in_flight"] == 0
    assert col.collect(learner_version=1).num_trained == G * N
  finally:
    col.stop()


def test_dynamic_sampling_lets_generation_run_as_far_ahead_as_steps_consume(parts):
  """A verifier that gives reward variance only to prompts starting with 0 or 1 (a
  fifth): after a collect has seen its kept / taken ratio, the gate reckons G / ratio
  groups a step and lets that many into the buffer, where counting every group as a
  trained one held one round ahead."""
  s, p = parts
  rl = dataclasses.replace(s.rl, dynamic_sampling=True, max_refill_rounds=7,
                           buffer_groups=64, gate_keep="observed")
  s = dataclasses.replace(s, rl=rl)

  def fifth(task, completion):
    return float(task.prompt[0] in "01" and zlib.crc32(completion.encode()) % 2 == 0)

  saved = dict(registry.VERIFIER_REGISTRY)
  registry.register("synthetic", registry.FunctionVerifier(fifth))
  p.engine.update_weights(p.model.arrays(), 0)
  col = AsyncCollector(s, p.mixer, p.engine, pad_id=p.pad_id, key=jax.random.key(3))
  col.start()
  try:
    _wait(lambda: col.counts()["buffered"] == 2 * G)   # version 0 and 1's rounds, as before
    batch = col.collect(learner_version=0)
    taken = batch.num_trained // N + batch.dropped_groups
    keep = (batch.num_trained // N) / taken
    assert batch.dropped_groups > 0 and keep < 0.75
    # the learner trains (version 1 next); the engine still serves version 0, so the
    # gate allows groups that the collect at version 1 takes
    budget = rl.collect_budget(G)
    c = col.counts()
    expect = next(a for a in itertools.count(c["buffered"] + c["in_flight"], G)
                  if collects_ahead(a + G - 1, kept=0, consumed=0, prompts_per_step=G,
                                    budget=budget, keep=keep) > 0)
    assert expect >= 2 * G   # was: one round (G groups) ahead of that collect
    _wait(lambda: col.counts()["buffered"] == expect)
    time.sleep(1.0)
    assert col.counts()["buffered"] == expect and col.counts()["in_flight"] == 0
  finally:
    col.stop()
    registry.VERIFIER_REGISTRY.clear()
    registry.VERIFIER_REGISTRY.update(saved)
