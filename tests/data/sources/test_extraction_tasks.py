"""The synthetic annual-report generator: seeded, disjoint splits, consistent gold."""

import pytest

from rlpt.data.sources import extraction_tasks, splits


def test_deterministic_and_disjoint():
  s = extraction_tasks.ExtractionSource(tokens=(2_000, 3_000), seed=2)
  train = [s.train(i) for i in range(8)]
  assert [t.prompt for t in train] == [extraction_tasks.ExtractionSource(
      tokens=(2_000, 3_000), seed=2).train(i).prompt for i in range(8)]
  hold = s.holdout(3)
  assert all(splits.is_holdout(t.prompt) for t in hold)
  assert not any(splits.is_holdout(t.prompt) for t in train)


def test_gold_is_consistent_with_the_report():
  s = extraction_tasks.ExtractionSource(tokens=(2_000, 3_000), fields=(20, 20), seed=4)
  for i in range(5):
    t = s.train(i)
    g = t.answer
    assert g["gross_profit"] == g["revenue"] - g["cost_of_revenue"]
    assert g["total_equity"] == g["total_assets"] - g["total_liabilities"]
    assert g["gross_margin_pct"] == pytest.approx(100 * g["gross_profit"] / g["revenue"], abs=0.06)
    scale = 1_000 if "in thousands, except per-share" in t.prompt else 1_000_000
    assert f"| Revenue | {g['revenue'] // scale:,} |" in t.prompt
    assert g["company_name"] in t.prompt and f"{g['employees']:,} employees" in t.prompt
    assert set(t.metadata["fields"]) == set(g)


def test_bad_config():
  with pytest.raises(ValueError, match="tokens must satisfy"):
    extraction_tasks.ExtractionSource(tokens=(100, 50))
  with pytest.raises(ValueError, match="fields must be within"):
    extraction_tasks.ExtractionSource(fields=(0, 3))
