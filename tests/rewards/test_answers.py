"""Final-answer extraction: nested braces, last match, hedging count, sources order."""

import pytest

from rlpt.rewards import answers


def test_boxed_nested_and_escaped():
  assert answers.boxed_contents(r"a \boxed{\frac{1}{2}} b \boxed{\{1\}}") == [r"\frac{1}{2}", r"\{1\}"]
  assert answers.boxed_contents(r"\boxed{unclosed") == []


def test_extract_last_and_distinct():
  e = answers.extract(r"\boxed{1} then \boxed{2} finally \boxed{ 2 }")
  assert e.answer == "2" and e.source == "boxed" and e.distinct == 2
  assert answers.extract(r"\boxed{7} \boxed{7}").distinct == 1


def test_sources_order():
  text = r"<answer>5</answer> and \boxed{6}"
  assert answers.extract(text).answer == "6"
  assert answers.extract(text, ("answer_tag", "boxed")).answer == "5"
  assert answers.extract("nothing").answer is None
  with pytest.raises(ValueError, match="answer source 'latex' unknown"):
    answers.extract(text, ("latex",))
