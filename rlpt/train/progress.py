"""Progress bar and end-of-run summary table for long-running loops.

    with ProgressBar(total=100, desc="rl") as bar:
      for step in ...:
        bar.update(step + 1, reward=0.41, rollout_s=3.2, train_s=1.1)
    print_summary("holdout accuracy", ["domain", "before", "after"], rows)

Bars draw with tqdm on stderr; in a non-interactive run they print at most one
line per `min_interval_s` so logs stay readable.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import tqdm


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:.3g}"
  return str(v)


class ProgressBar:
  """A step-indexed progress bar whose postfix shows the latest metrics."""

  def __init__(self, total: int, desc: str = "", *, initial: int = 0,
               min_interval_s: float = 1.0, disable: bool = False):
    interactive = sys.stderr.isatty()
    self._bar = tqdm.tqdm(total=total, desc=desc, initial=initial, disable=disable,
                          dynamic_ncols=True, file=sys.stderr,
                          mininterval=min_interval_s if interactive else 10 * min_interval_s)
    self._n = initial

  def update(self, n: int, **postfix: Any) -> None:
    """Moves the bar to absolute position `n` and shows `postfix` metrics."""
    if postfix:
      self._bar.set_postfix_str(" ".join(f"{k}={_fmt(v)}" for k, v in postfix.items()),
                                refresh=False)
    self._bar.update(n - self._n)
    self._n = n

  def close(self) -> None:
    self._bar.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def format_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain-text table (columns padded), for logs and the end-of-run summary."""
  cells = [[str(h) for h in header]] + [[_fmt(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths)))
  sep = "-" * (sum(widths) + 2 * (len(widths) - 1))
  return "\n".join([title, sep, line(cells[0]), sep] + [line(r) for r in cells[1:]] + [sep])


def print_summary(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
                  file=None) -> None:
  print(format_table(title, header, rows), file=file or sys.stdout, flush=True)
