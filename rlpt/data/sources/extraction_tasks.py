"""The "extraction" task source: long synthetic annual reports with known fields.

Each task is one seeded report of a fictional company: cover page, letter to
shareholders, MD&A narrative, income statement / balance sheet / cash-flow
tables (current and prior year, amounts "in thousands" or "in millions"),
segment and quarterly tables, numbered notes with footnotes, boilerplate policy
notes padding it to the target length (2k-100k tokens, ~4 chars a token), and
sometimes a restatement: the narrative quotes the figure as originally reported,
a note gives the restated one, and the restated figure is the truth.

The model is asked for a JSON object with a subset of `FIELDS`; `task.answer`
is the gold dict (money in full currency units, percentages as percent numbers,
counts as integers, strings as written) and `metadata["fields"]` maps each
asked field to its kind ("money", "per_share", "count", "pct", "text").
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from rlpt.data.sources import splits
from rlpt.types import Task

FIELDS = {
    "company_name": "text", "fiscal_year_end": "text", "auditor": "text",
    "headquarters_city": "text", "revenue": "money", "cost_of_revenue": "money",
    "gross_profit": "money", "operating_income": "money", "net_income": "money",
    "total_assets": "money", "total_liabilities": "money", "total_equity": "money",
    "cash_and_equivalents": "money", "long_term_debt": "money",
    "capital_expenditures": "money", "diluted_eps": "per_share", "employees": "count",
    "gross_margin_pct": "pct", "effective_tax_rate_pct": "pct", "revenue_growth_pct": "pct",
}
_SYL = ["al", "bor", "cen", "dra", "el", "fen", "gar", "hal", "is", "jor", "kel", "lum", "mar",
        "nor", "or", "pel", "quin", "ros", "sal", "tor", "ul", "ver", "wes", "xan", "yor", "zel"]
_SUFFIX = ["Holdings, Inc.", "Corporation", "Group plc", "Industries AG", "Systems Ltd.",
           "Technologies, Inc.", "Partners N.V."]
_CITIES = ["Rivermouth", "Eastbridge", "Northvale", "Port Sarin", "Lakeview", "Ashford",
           "Kingsreach", "Silverton", "Marlow Bay", "Greyhaven"]
_AUDITORS = ["Halvorsen & Pike LLP", "Moreau Kessler Audit", "Brightline Assurance LLP",
             "Okafor Lund & Co.", "Castell Ward Accountants"]
_FIRST = ["Amara", "Jonas", "Priya", "Mateo", "Ingrid", "Kwame", "Yuki", "Elena", "Tomas", "Leila"]
_LAST = ["Varga", "Okonkwo", "Lindqvist", "Haddad", "Moreno", "Tanaka", "Fischer", "Rossi"]
_MONTHS = ["March 31", "June 30", "September 30", "December 31"]
_CURRENCIES = [("USD", "$"), ("EUR", "€"), ("GBP", "£")]
_SEGMENTS = ["Industrial", "Consumer", "Services", "Software", "Healthcare", "Logistics"]
_POLICY_TOPICS = ["revenue recognition", "leases", "inventories", "goodwill and intangible assets",
                  "income taxes", "share-based compensation", "financial instruments",
                  "property, plant and equipment", "provisions and contingencies",
                  "foreign currency translation", "pensions", "segment reporting",
                  "impairment of long-lived assets", "credit losses", "derivatives"]
_POLICY_SENTENCES = [
    "The Company applies the {t} guidance consistently to all periods presented.",
    "Management reviews its estimates relating to {t} at each reporting date.",
    "Judgements about {t} require assumptions that may differ from actual outcomes.",
    "Changes in estimates related to {t} are recognized prospectively.",
    "The Company evaluated recently issued pronouncements on {t} and expects no material impact.",
    "Disclosures about {t} are aggregated where items share similar economic characteristics.",
    "Amounts related to {t} are presented net where a legal right of offset exists.",
    "The audit committee reviewed the critical accounting policies for {t} during the year.",
]


def _name(rng: np.random.Generator) -> str:
  syl = rng.choice(_SYL, size=int(rng.integers(2, 4)))
  return "".join(syl).capitalize() + " " + _SUFFIX[int(rng.integers(len(_SUFFIX)))]


@dataclasses.dataclass(frozen=True)
class _Report:
  text: str
  gold: dict
  restated: str | None


def _fmt(v: float) -> str:
  """Amounts in tables: thousands separators, negatives in parentheses."""
  s = f"{abs(int(round(v))):,}"
  return f"({s})" if v < 0 else s


def _policy_note(rng, k: int, topic: str) -> str:
  n = int(rng.integers(4, 9))
  sents = [_POLICY_SENTENCES[int(i)].format(t=topic)
           for i in rng.integers(0, len(_POLICY_SENTENCES), size=n)]
  return f"Note {k} — {topic.capitalize()}\n\n" + " ".join(sents) + "\n"


def generate_report(rng: np.random.Generator, target_tokens: int) -> _Report:
  """One report of about `target_tokens` tokens (chars / 4) and its gold fields."""
  name = _name(rng)
  city = _CITIES[int(rng.integers(len(_CITIES)))]
  auditor = _AUDITORS[int(rng.integers(len(_AUDITORS)))]
  ceo = f"{_FIRST[int(rng.integers(len(_FIRST)))]} {_LAST[int(rng.integers(len(_LAST)))]}"
  year = int(rng.integers(2015, 2026))
  fye = f"{_MONTHS[int(rng.integers(4))]}, {year}"
  cur, sym = _CURRENCIES[int(rng.integers(3))]
  scale_word, scale = (("thousands", 1_000) if rng.random() < 0.5 else ("millions", 1_000_000))
  # Amounts in table units (thousands or millions).
  unit_rev = rng.uniform(2e3, 5e5) if scale == 1_000 else rng.uniform(50, 9e3)
  rev = round(unit_rev)
  growth = rng.uniform(-15, 35)
  prev_rev = round(rev / (1 + growth / 100))
  growth = round((rev / prev_rev - 1) * 100, 1)
  cogs = round(rev * rng.uniform(0.35, 0.75))
  gp = rev - cogs
  opex = round(gp * rng.uniform(0.3, 0.9))
  op_inc = gp - opex
  tax_rate = round(rng.uniform(12, 30), 1)
  interest = round(rev * rng.uniform(0.0, 0.03))
  pretax = op_inc - interest
  tax = round(pretax * tax_rate / 100)
  net = pretax - tax
  shares_m = rng.uniform(20, 900)  # millions of diluted shares
  assets = round(rev * rng.uniform(0.8, 2.5))
  liab = round(assets * rng.uniform(0.3, 0.75))
  equity = assets - liab
  cash = round(assets * rng.uniform(0.05, 0.25))
  ltd = round(liab * rng.uniform(0.2, 0.6))
  capex = round(rev * rng.uniform(0.02, 0.12))
  employees = int(rng.integers(150, 90_000))
  prev = {k: round(v * rng.uniform(0.8, 1.1)) for k, v in
          dict(cogs=cogs, opex=opex, net=net, assets=assets, liab=liab, cash=cash, ltd=ltd,
               capex=capex).items()}
  restated = None
  orig_net = net
  if rng.random() < 0.4:  # a restatement of net income: the narrative quotes the old figure
    restated = "net_income"
    orig_net = net + round(abs(net) * rng.uniform(0.05, 0.3)) * (1 if rng.random() < 0.5 else -1)
  eps = round(net * scale / (shares_m * 1e6), 2)
  gm = round(gp / rev * 100, 1)
  restate_note = 14 + int(rng.integers(0, 6))

  def money(v):  # narrative: "$1,234 million" / "€56,789 thousand"
    return f"{sym}{_fmt(v)} {'million' if scale == 1_000_000 else 'thousand'}"

  head = (f"{name}\nANNUAL REPORT\nFor the fiscal year ended {fye}\n"
          f"Headquarters: {city}\nIndependent auditor: {auditor}\n"
          f"(All amounts in {cur} {scale_word}, except per-share data, percentages and "
          "employee counts, unless stated otherwise.)\n\n")
  letter = (f"LETTER TO SHAREHOLDERS\n\nDear shareholders,\n\nFiscal {year} tested our "
            f"discipline. Revenue reached {money(rev)}, compared with {money(prev_rev)} a year "
            f"earlier, and net income as originally reported was {money(orig_net)}. We ended the "
            f"year with {employees:,} employees across our operations.\n\n{ceo}\n"
            "Chief Executive Officer\n\n")
  mdna = (f"MANAGEMENT'S DISCUSSION AND ANALYSIS\n\nRevenue grew {growth}% year over year "
          f"(prior year: {money(prev_rev)}). Gross margin was {gm}% as cost of revenue moved to "
          f"{money(cogs)} from {money(prev['cogs'])}. Capital expenditures were {money(capex)} "
          f"(prior year {money(prev['capex'])}). Long-term debt stood at {money(ltd)} at year "
          "end; management expects to refinance a portion in the coming year.\n\n")
  mark = "(a)" if restated else ""
  income = (f"CONSOLIDATED STATEMENT OF INCOME\n({cur} in {scale_word}, except per-share data)\n\n"
            f"| Line item | FY{year} | FY{year - 1} |\n|---|---:|---:|\n"
            f"| Revenue | {_fmt(rev)} | {_fmt(prev_rev)} |\n"
            f"| Cost of revenue | {_fmt(cogs)} | {_fmt(prev['cogs'])} |\n"
            f"| Gross profit | {_fmt(gp)} | {_fmt(prev_rev - prev['cogs'])} |\n"
            f"| Operating expenses | {_fmt(opex)} | {_fmt(prev['opex'])} |\n"
            f"| Operating income | {_fmt(op_inc)} | {_fmt(prev_rev - prev['cogs'] - prev['opex'])} |\n"
            f"| Interest expense | {_fmt(-interest)} | {_fmt(-round(interest * 0.9))} |\n"
            f"| Income tax expense | {_fmt(-tax)} | {_fmt(-round(tax * 0.9))} |\n"
            f"| Net income {mark} | {_fmt(net)} | {_fmt(prev['net'])} |\n"
            f"| Diluted earnings per share ({sym}) | {eps:.2f} | {eps * 0.9:.2f} |\n\n")
  if restated:
    income += f"(a) As restated; see Note {restate_note}.\n\n"
  balance = (f"CONSOLIDATED BALANCE SHEET\n({cur} in {scale_word})\n\n"
             f"| | {fye} | prior year end |\n|---|---:|---:|\n"
             f"| Cash and cash equivalents | {_fmt(cash)} | {_fmt(prev['cash'])} |\n"
             f"| Total assets | {_fmt(assets)} | {_fmt(prev['assets'])} |\n"
             f"| Long-term debt | {_fmt(ltd)} | {_fmt(prev['ltd'])} |\n"
             f"| Total liabilities | {_fmt(liab)} | {_fmt(prev['liab'])} |\n"
             f"| Total shareholders' equity | {_fmt(equity)} | {_fmt(prev['assets'] - prev['liab'])} |\n\n")
  cash_flow = (f"CONSOLIDATED STATEMENT OF CASH FLOWS (extract)\n({cur} in {scale_word})\n\n"
               f"| | FY{year} | FY{year - 1} |\n|---|---:|---:|\n"
               f"| Purchases of property and equipment | {_fmt(-capex)} | {_fmt(-prev['capex'])} |\n"
               f"| Net cash from operating activities | {_fmt(net + capex)} | {_fmt(prev['net'])} |\n\n")
  segs = list(rng.choice(_SEGMENTS, size=3, replace=False))
  shares = rng.dirichlet(np.ones(3))
  seg_rev = [round(rev * s) for s in shares[:2]]
  seg_rev.append(rev - sum(seg_rev))
  segment = (f"Note 3 — Segment information\n\n| Segment | Revenue ({scale_word}) |\n|---|---:|\n"
             + "".join(f"| {s} | {_fmt(v)} |\n" for s, v in zip(segs, seg_rev)) + "\n")
  quarters = rng.dirichlet(np.ones(4) * 5)
  qrev = [round(rev * q) for q in quarters]
  quarterly = ("Note 4 — Quarterly results (unaudited)\n\n| Quarter | Revenue |\n|---|---:|\n"
               + "".join(f"| Q{i + 1} | {_fmt(v)} |\n" for i, v in enumerate(qrev)) + "\n")
  tax_note = (f"Note 7 — Income taxes\n\nThe effective tax rate for fiscal {year} was {tax_rate}% "
              f"(statutory rate: 21.0%).[1]\n\n[1] The difference reflects foreign rate "
              "differentials and research credits.\n\n")
  staff_note = (f"Note 9 — Employees\n\nAt {fye} the Company had {employees:,} employees "
                f"(prior year: {int(employees * rng.uniform(0.8, 1.1)):,}).\n\n")
  restate_text = ""
  if restated:
    restate_text = (f"Note {restate_note} — Restatement of previously issued financial statements"
                    f"\n\nNet income for fiscal {year} as originally reported, {money(orig_net)}, "
                    f"has been restated to {money(net)} to correct the timing of revenue "
                    "recognition on multi-year service contracts.[2]\n\n[2] The restatement has "
                    "no effect on cash.\n\n")
  core = head + letter + mdna + income + balance + cash_flow + segment + quarterly + tax_note + staff_note
  budget = max(0, target_tokens * 4 - len(core) - len(restate_text))
  pads, k, used = [], 20, 0
  while used < budget:
    p = _policy_note(rng, k, _POLICY_TOPICS[int(rng.integers(len(_POLICY_TOPICS)))])
    pads.append(p + "\n")
    used += len(p) + 1
    k += 1
  # The restatement note lands at a random place among the padding notes.
  cut = int(rng.integers(0, len(pads) + 1))
  text = core + "NOTES TO THE FINANCIAL STATEMENTS (continued)\n\n" + "".join(
      pads[:cut]) + restate_text + "".join(pads[cut:])
  gold = {
      "company_name": name, "fiscal_year_end": fye, "auditor": auditor,
      "headquarters_city": city, "revenue": rev * scale, "cost_of_revenue": cogs * scale,
      "gross_profit": gp * scale, "operating_income": op_inc * scale, "net_income": net * scale,
      "total_assets": assets * scale, "total_liabilities": liab * scale,
      "total_equity": equity * scale, "cash_and_equivalents": cash * scale,
      "long_term_debt": ltd * scale, "capital_expenditures": capex * scale,
      "diluted_eps": eps, "employees": employees, "gross_margin_pct": gm,
      "effective_tax_rate_pct": tax_rate, "revenue_growth_pct": growth,
  }
  return _Report(text, gold, restated)


INSTRUCTION = (
    "Extract the fields below from the annual report. Answer with one JSON object "
    "(in a ```json block) with exactly these keys: {keys}.\n"
    "Money amounts in full currency units (convert 'in thousands' / 'in millions'), "
    "per-share amounts as numbers, percentages as percent numbers (12.5 for 12.5%), "
    "counts as integers, text as written. Where a figure was restated, give the restated one.")


@dataclasses.dataclass(frozen=True)
class ExtractionSource(splits.GeneratedSource):
  """Seeded, index-addressed "extraction" tasks.

  Attributes:
    tokens: (min, max) report length in tokens (chars / 4), drawn log-uniformly.
    fields: (min, max) number of fields asked per task.
    seed: stream seed.
  """

  tokens: tuple[int, int] = (2_000, 100_000)
  fields: tuple[int, int] = (4, 10)
  seed: int = 0
  domain: str = "extraction"

  def __post_init__(self):
    lo, hi = self.tokens
    if not 500 <= lo <= hi:
      raise ValueError(f"extraction: tokens must satisfy 500 <= min <= max, got {self.tokens}")
    if not 1 <= self.fields[0] <= self.fields[1] <= len(FIELDS):
      raise ValueError(f"extraction: fields must be within 1..{len(FIELDS)}, got {self.fields}")

  def _make(self, rng: np.random.Generator) -> Task:
    lo, hi = self.tokens
    target = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    rep = generate_report(rng, target)
    k = int(rng.integers(self.fields[0], self.fields[1] + 1))
    names = sorted(rng.choice(list(FIELDS), size=k, replace=False).tolist())
    if rep.restated and rep.restated not in names:
      names = sorted(names + [rep.restated])
    prompt = (INSTRUCTION.format(keys=", ".join(names)) + "\n\n<report>\n" + rep.text
              + "</report>\n")
    return Task(self.domain, prompt, answer={n: rep.gold[n] for n in names},
                metadata={"fields": {n: FIELDS[n] for n in names}, "tokens": len(rep.text) // 4,
                          "restated": rep.restated})

  def reference(self, task: Task) -> str:
    return "```json\n" + json.dumps(task.answer) + "\n```"
