"""The synthetic verifiable task: source, its built-in verifier, tokenizer."""

import pytest

from rlpt.data import synthetic
from rlpt.rewards import synthetic as synthetic_verifier


def test_synthetic_source_and_verifier():
  src = synthetic.SyntheticSource(ops=("copy", "reverse", "sum"), length=(2, 3), seed=0)
  tasks = [src.train(i) for i in range(200)]
  assert tasks[:5] == [src.train(i) for i in range(5)]  # pure function of the index
  for t in tasks:
    op = t.metadata["op"]
    digits = t.prompt[len(op) + 1:-1].replace(" ", "")
    want = {"copy": digits, "reverse": digits[::-1], "sum": str(sum(map(int, digits)))}[op]
    assert t.answer == want and t.prompt.endswith("=")
    assert synthetic_verifier.verify(t, t.answer + "\nanything").score == 1.0
  hold = src.holdout(50)
  assert hold == src.holdout(50)
  assert not {t.prompt for t in hold} & {t.prompt for t in tasks}
  # Disjoint even where the prompt space is tiny (copy of 2 digits: 100 prompts).
  small = synthetic.SyntheticSource()
  train_prompts = {small.train(i).prompt for i in range(2000)}
  hold_prompts = {t.prompt for t in small.holdout(200)}
  assert len(train_prompts) + len(hold_prompts) == 100 and not train_prompts & hold_prompts


def test_synthetic_scores():
  t = synthetic.SyntheticSource().train(0)
  a = t.answer
  assert synthetic_verifier.verify(t, a).score == 1.0
  half = synthetic_verifier.verify(t, a[0] + str((int(a[1]) + 1) % 10))
  assert half.score == pytest.approx(0.25) and half.violations == ()
  junk = synthetic_verifier.verify(t, "xy")
  assert junk.score == 0.0 and junk.violations == ("format",)
  assert synthetic_verifier.verify(t, a + "0").score == pytest.approx(0.5 * 2 / 3)
  with pytest.raises(ValueError, match="unknown op"):
    synthetic.SyntheticSource(ops=("mul",))


def test_synthetic_domains_have_their_verifier_built_in():
  from rlpt import rewards
  t = synthetic.SyntheticSource().train(3)
  r = rewards.compute_rewards([t, t], [t.answer, "zz"])
  assert [x.score for x in r] == [1.0, 0.0] and r[1].violations == ("format",)
  mixed = synthetic.SyntheticSource(ops=("copy", "sum"), domain="synthetic/copy+sum").train(0)
  assert rewards.has_verifier("synthetic/copy+sum") and not rewards.has_verifier("synthetics")
  assert rewards.compute_reward(mixed, mixed.answer).score == 1.0
  with pytest.raises(KeyError, match="no verifier registered for task domain 'synthetics'"):
    rewards.get_verifier("synthetics")


def test_char_tokenizer_roundtrip():
  tok = synthetic.char_tokenizer(synthetic.chars_for([("copy",), ("reverse", "sum")]))
  assert tok.get_vocab_size() == 3 + 13 + len(set("reversesum"))
  text = "reverse 4 7=\n123"
  ids = tok.encode(text).ids
  assert len(ids) == len(text) and tok.decode(ids) == text
  assert tok.token_to_id("<eos>") == 2
  assert synthetic.char_tokenizer().get_vocab_size() == 16  # digits, " ", "=", "\n"


def test_char_tokenizer_wrapper_and_chat_template():
  tok = synthetic.tokenizer()
  ids = tok.apply_chat_template([{"role": "user", "content": "47="}], tokenize=True)
  assert ids[0] == tok.bos_token_id and tok.decode(ids) == "47="
  assert tok.decode(ids + [tok.eos_token_id]) == "47="
  assert tok.encode("47=") == ids[1:]
  with pytest.raises(ValueError, match="no user message"):
    tok.apply_chat_template([{"role": "system", "content": "x"}])
