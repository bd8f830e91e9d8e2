r"""Audits every registered domain's verifier against degenerate completions and
constant answers (rlpt.train.reward_audit).

  python -m launch.audit_rewards [--domains=math,rg/gcd] [--n=4] [--json=FILE]

Prints one row per domain: the reference's lowest score (must be 1), the degenerate
completion with the most reward and that reward, the best constant answer and its
holdout hit rate, and the verdict. Exit status 1 when a reference does not score 1 or a
degenerate completion earns reward through a verifier flaw; unaudited domains (no
reference completion) are listed with the reason and do not fail the audit.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

_DOMAINS = flags.DEFINE_list("domains", None, "Domains to audit (default: every registered "
                             "domain that has a task source).")
_N = flags.DEFINE_integer("n", 4, "Train and holdout tasks per domain for the degenerate battery.")
_N_CONSTANT = flags.DEFINE_integer("n_constant", 64, "Train tasks the best constant is read from.")
_JSON = flags.DEFINE_string("json", None, "Also write the rows to this JSON file.")


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  from rlpt import rewards
  from rlpt.data import sources
  from rlpt.train import progress, reward_audit
  known = sources.domains()
  domains = _DOMAINS.value or [d for d in known if rewards.has_verifier(d)]
  unknown = [d for d in domains if d not in known]
  if unknown:
    sys.stderr.write(f"launch.audit_rewards: no task source for {unknown}\n")
    sys.exit(2)
  rows = reward_audit.audit(domains, n=_N.value, n_constant=_N_CONSTANT.value)
  table = []
  for r in rows:
    verdict = ("unaudited: " + r.unaudited if r.unaudited else "ok" if r.ok
               else "FLAW" if r.flaws else "REFERENCE FAILS")
    if r.ok and r.constant_hit_rate == 1.0:  # a constant right on every holdout task
      verdict += " (the constant wins every holdout task: read the verifier)"
    table.append([r.domain, f"{r.reference_min:.2f}" if not r.unaudited else "-",
                  r.worst_degenerate or "-", f"{r.worst_degenerate_reward:.2f}",
                  (r.constant[:24] or "-"),
                  f"{100 * r.constant_hit_rate:.1f}" if r.constant_hit_rate == r.constant_hit_rate
                  else "-", verdict])
  progress.print_summary("reward audit", ["domain", "reference", "best degenerate", "reward",
                                          "best constant", "constant hit %", "verdict"], table)
  flawed = [r for r in rows if not r.ok and not r.unaudited]
  for r in flawed:
    for kind, text, score in r.flaws[:3]:
      print(f"{r.domain}: {kind} scored {score:.2f}: {text!r}")
    if r.reference_min < 1.0:
      print(f"{r.domain}: the reference completion scored {r.reference_min:.2f}")
  print(f"{len(rows)} domains: {sum(r.ok for r in rows)} ok, {len(flawed)} failing, "
        f"{sum(bool(r.unaudited) for r in rows)} unaudited")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump({"rows": [dict(r.__dict__, ok=r.ok) for r in rows]}, f, indent=1, default=str)
  sys.exit(1 if flawed else 0)


if __name__ == "__main__":
  app.run(main)
