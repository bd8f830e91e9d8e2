"""What every benchmark shares: result rows, the comparison table, the JSON file,
timing helpers and the measured fp32 matmul peak that rlpt's GFLOP/s is compared to."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Callable, Sequence


@dataclasses.dataclass
class Row:
  """One measured quantity, rlpt beside its baseline.

  `ratio` > 1 means rlpt is better: rlpt/baseline when higher is better (throughput),
  baseline/rlpt when lower is better (latency, memory).
  """

  name: str
  rlpt: float
  baseline: float | None
  unit: str = ""
  higher_is_better: bool = True
  note: str = ""

  @property
  def ratio(self) -> float | None:
    if self.baseline is None or self.baseline == 0 or self.rlpt == 0:
      return None
    return self.rlpt / self.baseline if self.higher_is_better else self.baseline / self.rlpt


def _num(v: float | None) -> str:
  if v is None:
    return "-"
  return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


def format_rows(title: str, rows: Sequence[Row], baseline_name: str = "baseline") -> str:
  header = ["name", "rlpt", baseline_name, "ratio", "unit", "note"]
  body = [[r.name, _num(r.rlpt), _num(r.baseline),
           "-" if r.ratio is None else f"{r.ratio:.2f}x", r.unit, r.note] for r in rows]
  widths = [max(len(str(x[i])) for x in [header] + body) for i in range(len(header))]
  fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
  sep = "-" * len(fmt(header))
  return "\n".join([title, sep, fmt(header), sep] + [fmt(b) for b in body] + [sep])


def write_json(path: str, rows: Sequence[Row], **extra) -> None:
  payload = {"rows": [{"name": r.name, "rlpt": r.rlpt, "baseline": r.baseline,
                       "ratio": r.ratio, "unit": r.unit, "note": r.note} for r in rows]}
  payload.update(extra)
  with open(path, "w") as f:
    json.dump(payload, f, indent=2)


def time_fn(fn: Callable[[], object], *, warmup: int = 1, iters: int = 5) -> list[float]:
  """Wall seconds of `iters` calls of `fn` after `warmup` calls (fn must block)."""
  for _ in range(warmup):
    fn()
  out = []
  for _ in range(iters):
    t0 = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t0)
  return out


def percentile(xs: Sequence[float], q: float) -> float:
  xs = sorted(xs)
  if not xs:
    return float("nan")
  k = (len(xs) - 1) * q / 100.0
  lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
  return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def matmul_peak_gflops(n: int = 1024, iters: int = 20) -> float:
  """GFLOP/s of a jitted fp32 n x n matmul on the default device: the compute
  ceiling that model throughput is reported against (median of `iters` runs)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  secs = time_fn(lambda: f(a, b).block_until_ready(), warmup=3, iters=iters)
  return 2 * n ** 3 / statistics.median(secs) / 1e9
