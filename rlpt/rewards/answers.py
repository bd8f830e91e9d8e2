r"""Pulling the final answer out of a completion: `\boxed{...}` and `<answer>` tags.

`\boxed{}` is matched with brace counting (answers hold nested braces, e.g.
`\frac{1}{2}`); `<answer>...</answer>` with a non-greedy match. Every match is
returned, in order of appearance, so verifiers can both take the last one and
reject completions that hedge over several different answers.
"""

from __future__ import annotations

import dataclasses
import re

ANSWER_SOURCES = ("boxed", "answer_tag")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str) -> list[str]:
  r"""Contents of every balanced `\boxed{...}` / `\fbox{...}` in `text`, in order."""
  out = []
  for m in _BOXED.finditer(text):
    depth, i = 1, m.end()
    while i < len(text) and depth:
      c = text[i]
      if c == "\\" and i + 1 < len(text):  # skip escaped characters such as \{ and \}
        i += 2
        continue
      depth += (c == "{") - (c == "}")
      i += 1
    if depth == 0:
      out.append(text[m.end():i - 1].strip())
  return out


def tag_contents(text: str) -> list[str]:
  """Contents of every `<answer>...</answer>` in `text`, in order."""
  return [m.group(1).strip() for m in _TAG.finditer(text)]


@dataclasses.dataclass(frozen=True)
class Extracted:
  """The answer found in a completion.

  Attributes:
    answer: the last match of the first source (in `sources` order) that has any;
      None if no source matched.
    source: which source it came from ("boxed" / "answer_tag"), or "".
    candidates: every match of that source, in order.
  """

  answer: str | None
  source: str
  candidates: tuple[str, ...]

  @property
  def distinct(self) -> int:
    """Number of different answers offered (hedging when > 1)."""
    return len({" ".join(c.split()) for c in self.candidates})


def extract(text: str, sources: tuple[str, ...] = ("boxed", "answer_tag")) -> Extracted:
  """Finds the final answer in `text`, trying `sources` in order (see module doc)."""
  for s in sources:
    if s == "boxed":
      found = boxed_contents(text)
    elif s == "answer_tag":
      found = tag_contents(text)
    else:
      raise ValueError(f"answer source {s!r} unknown; expected one of {ANSWER_SOURCES}")
    if found:
      return Extracted(found[-1], s, tuple(found))
  return Extracted(None, "", ())
