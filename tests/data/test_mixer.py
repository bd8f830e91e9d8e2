"""Domain mixer: ratios, determinism, exact resume through JSON, curriculum."""

import json

import numpy as np
import pytest

from rlpt.data import mixer as mixer_lib
from rlpt.data import synthetic


def _sources():
  return {"copy": synthetic.SyntheticSource(ops=("copy",), seed=1, domain="copy"),
          "sum": synthetic.SyntheticSource(ops=("sum",), seed=2, domain="sum"),
          "rev": synthetic.SyntheticSource(ops=("reverse",), seed=3, length=(3, 4),
                                           domain="rev")}


def test_ratios_follow_weights():
  m = mixer_lib.DomainMixer(_sources(), {"copy": 1.0, "sum": 3.0, "rev": 0.0}, seed=0)
  tasks = m.sample(4000)
  counts = {d: sum(t.domain == d for t in tasks) for d in ("copy", "sum", "rev")}
  assert counts["rev"] == 0
  assert counts["sum"] / 4000 == pytest.approx(0.75, abs=0.03)
  assert m.stats()["sum"]["drawn"] == counts["sum"]


def test_deterministic_and_exact_resume_through_json():
  a = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=7,
                            curriculum=mixer_lib.Curriculum("learnability", min_samples=2))
  b = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=7,
                            curriculum=mixer_lib.Curriculum("learnability", min_samples=2))
  first = a.sample(10)
  assert first == b.sample(10)
  a.update({"copy": [1.0, 1.0], "sum": [0.5]})
  state = json.loads(json.dumps(a.get_state()))  # what the checkpoint stores
  want = [a.sample(6) for _ in range(3)]
  c = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=99,
                            curriculum=mixer_lib.Curriculum("learnability", min_samples=2))
  c.set_state(state)
  assert [c.sample(6) for _ in range(3)] == want
  other_seed = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=8)
  assert other_seed.sample(10) != first


def test_curriculum_down_weights_solved_and_hopeless_domains():
  m = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=0,
                            curriculum=mixer_lib.Curriculum("learnability", ema=1.0,
                                                            floor=0.1, min_samples=4))
  np.testing.assert_allclose(list(m.probabilities().values()), [1 / 3] * 3)
  m.update({"copy": [1.0] * 8, "sum": [0.0] * 8, "rev": [0.0, 1.0] * 4})
  p = m.probabilities()
  # weights 0.1, 1.0 (p=0.5), 0.1 -> probabilities 0.1/1.2, 1/1.2, 0.1/1.2
  assert p["rev"] == pytest.approx(1 / 1.2)
  assert p["copy"] == pytest.approx(0.1 / 1.2) and p["sum"] == pytest.approx(0.1 / 1.2)
  fixed = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=0)
  fixed.update({"copy": [1.0] * 8})
  assert fixed.probabilities()["copy"] == pytest.approx(1 / 3)


def test_ema_and_min_samples():
  m = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1}, seed=0,
                            curriculum=mixer_lib.Curriculum("learnability", ema=0.5,
                                                            min_samples=4))
  m.update({"copy": [1.0, 1.0]})
  assert m.probabilities()["copy"] == pytest.approx(0.5)  # 2 < min_samples
  m.update({"copy": [0.0, 0.0]})
  assert m.stats()["copy"]["score_avg"] == pytest.approx(0.5)
  assert m.probabilities()["copy"] == pytest.approx(0.5)  # 4 p (1-p) = 1


@pytest.mark.parametrize("weights, match", [
    ({"nope": 1.0}, "without a task source"),
    ({}, "at least one"),
    ({"copy": -1.0}, "'copy' must be a finite number"),
    ({"copy": 0.0}, "not all be 0"),
])
def test_bad_weights(weights, match):
  with pytest.raises(ValueError, match=match):
    mixer_lib.DomainMixer(_sources(), weights)


def test_bad_curriculum_and_state():
  with pytest.raises(ValueError, match="curriculum.kind"):
    mixer_lib.Curriculum("easy-first")
  m = mixer_lib.DomainMixer(_sources(), {"copy": 1.0})
  with pytest.raises(ValueError, match="domains"):
    m.set_state(mixer_lib.DomainMixer(_sources(), {"sum": 1.0}).get_state())


def test_forgetting_guard_flags_a_drop_boosts_it_and_lets_go_on_recovery():
  m = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 2}, seed=0,
                            curriculum=mixer_lib.Curriculum(forgetting_margin=0.1,
                                                            forgetting_boost=3.0))
  assert m.observe_holdout({"copy": 0.5, "sum": 0.2, "rev": 0.4}) == []
  assert m.observe_holdout({"copy": 0.7}) == []                 # a new best
  assert m.observe_holdout({"copy": 0.55, "sum": 0.15}) == ["copy"]   # 0.15 below 0.7
  p = m.probabilities()   # weights 3 (1 x boost 3), 1, 2
  assert p["copy"] == pytest.approx(0.5) and p["rev"] == pytest.approx(2 / 6)
  assert m.stats()["copy"]["forgetting"] == 1.0 and m.forgetting == ["copy"]
  state = json.loads(json.dumps(m.get_state()))
  again = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 2}, seed=5,
                                curriculum=mixer_lib.Curriculum(forgetting_margin=0.1,
                                                                forgetting_boost=3.0))
  again.set_state(state)
  assert again.forgetting == ["copy"] and again.probabilities() == p
  assert m.observe_holdout({"copy": 0.65}) == []               # back within the margin
  assert m.probabilities()["copy"] == pytest.approx(0.25)
  off = mixer_lib.DomainMixer(_sources(), {"copy": 1, "sum": 1, "rev": 1}, seed=0)
  off.observe_holdout({"copy": 0.9})
  assert off.observe_holdout({"copy": 0.0}) == []              # margin 0: no guard
  with pytest.raises(ValueError, match="forgetting_boost must be >= 1"):
    mixer_lib.Curriculum(forgetting_boost=0.5)


def test_cover_first_draws_every_weighted_domain_before_any_twice():
  srcs = {f"d{i}": synthetic.SyntheticSource(ops=("copy",), seed=i, domain=f"d{i}")
          for i in range(25)}
  weights = {d: 1.0 for d in srcs}
  weights["d0"], weights["d1"] = 50.0, 0.0       # d0 dominates the weighted draw; d1 is off
  cover = mixer_lib.Curriculum("learnability", cover_first=True)
  m = mixer_lib.DomainMixer(srcs, weights, seed=3, curriculum=cover)
  first = [t.domain for t in m.sample(4) + m.sample(4) + m.sample(4)]
  assert len(set(first)) == 12                   # no repeats while domains are unseen
  rest = [t.domain for t in m.sample(16)]
  seen = set(first) | set(rest[:12])
  assert seen == set(srcs) - {"d1"} and "d1" not in rest    # 24 weighted domains by draw 24
  assert rest[12:].count("d0") >= 3              # then the weights rule again
  plain = mixer_lib.DomainMixer(srcs, weights, seed=3)
  assert len({t.domain for t in plain.sample(24)}) < 10      # what coverage changes
  # resume inside the covering round continues it exactly
  a = mixer_lib.DomainMixer(srcs, weights, seed=5, curriculum=cover)
  a.sample(7)
  b = mixer_lib.DomainMixer(srcs, weights, seed=0, curriculum=cover)
  b.set_state(json.loads(json.dumps(a.get_state())))
  assert [t.domain for t in a.sample(20)] == [t.domain for t in b.sample(20)]
