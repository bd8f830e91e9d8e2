"""The reward audit: every registered domain on a sample (references score 1, no
degenerate completion is paid), a planted verifier flaw is caught, constants are
reported as baselines, and the CLI's exit status says so."""

import subprocess
import sys

import pytest

from rlpt import rewards
from rlpt.data import sources
from rlpt.train import reward_audit
from rlpt.types import RewardResult


def _domains():
  return [d for d in sources.domains() if rewards.has_verifier(d)]


@pytest.fixture(scope="module")
def rows():
  return reward_audit.audit(_domains(), n=1, n_constant=16)


def test_every_domain_is_audited_or_says_why(rows):
  assert len(rows) == len(_domains()) >= 110
  unaudited = {r.domain: r.unaudited for r in rows if r.unaudited}
  assert set(unaudited) == {"rg/boxnet"}, unaudited  # no reference plan in its entries
  bad = [(r.domain, r.reference_min, r.flaws[:2]) for r in rows if not r.unaudited and not r.ok]
  assert not bad, bad


def test_constant_baseline_is_reported_for_answer_domains(rows):
  by = {r.domain: r for r in rows}
  for d in ("math", "rg/gcd", "rg/basic_arithmetic", "extraction"):
    assert by[d].constant and 0.0 <= by[d].constant_hit_rate <= 1.0, d
  assert by["rg/gcd"].constant_hit_rate > 0  # gcd's answer is often small: a free baseline
  assert not by["code"].constant  # programs have no constant answer


def test_a_planted_flaw_is_caught():
  """A verifier that pays whenever the gold answer appears anywhere: hedging pays."""
  original = rewards.get_verifier("rg/gcd")

  def naive(task, completion):
    gold = reward_audit.answer_of(task)
    return RewardResult(score=float(gold is not None and gold in completion))
  rewards.register("rg/gcd", rewards.FunctionVerifier(naive, isolation="inline"))
  try:
    (row,) = reward_audit.audit(["rg/gcd"], n=2, n_constant=8)
  finally:
    rewards.register("rg/gcd", original)
  kinds = {k for k, _, _ in row.flaws}
  assert {"hedge_tags", "all_candidates"} <= kinds and not row.ok, row.flaws


def test_degenerate_battery_shapes():
  src = sources.get_source("rg/chain_sum", seed=0)
  t = src.train(0)
  comps = reward_audit.degenerate_completions(t, src.reference(t), ["123", "456", "789"])
  assert comps["empty_format"] == "<answer></answer>"
  gold = reward_audit.answer_of(t)
  assert comps["hedge_tags"].count("<answer>") == 4 and f"<answer>{gold}</answer>" in comps[
      "hedge_tags"]
  code = sources.get_source("code", seed=0)
  ct = code.train(0)
  stubs = [k for k in reward_audit.degenerate_completions(ct, code.reference(ct), []) if
           k.startswith("stub:")]
  assert len(stubs) == len(reward_audit.NULL_BODIES)


def test_cli_exit_status(tmp_path):
  out = subprocess.run([sys.executable, "-m", "launch.audit_rewards", "--domains=rg/gcd,rg/boxnet",
                        "--n=1", "--n_constant=8", f"--json={tmp_path / 'a.json'}"],
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "reward audit" in out.stdout and "unaudited" in out.stdout
  assert "2 domains: 1 ok, 0 failing, 1 unaudited" in out.stdout
  bad = subprocess.run([sys.executable, "-m", "launch.audit_rewards", "--domains=rg/nope"],
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "no task source for ['rg/nope']" in bad.stderr
