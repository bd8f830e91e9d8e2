"""Streamer: incremental SSE chunks that join to the finished answer (SmolLM2's real
tokenizer; no model)."""

import pytest

from rlpt.rollout import openai_api, openai_stream
from tests.rollout import serving


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


def _req(tok, kind="completion", **body):
  parse = openai_api.parse_completion if kind == "completion" else openai_api.parse_chat
  body = dict({"model": "m", "stream": True}, **body)
  if kind == "completion":
    body.setdefault("prompt", "Say")
  else:
    body.setdefault("messages", [{"role": "user", "content": "Say"}])
  return parse(body, tok, served_model="m", vocab_size=49152, max_context=512, rid="r")


def _body(kind, texts, finish="stop"):
  key = (lambda t: {"text": t}) if kind == "completion" else (
      lambda t: {"message": {"role": "assistant", "content": t}})
  return {"choices": [dict(key(t), index=i, finish_reason=finish, token_ids=[1])
                      for i, t in enumerate(texts)],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _text(chunks, index=0):
  out = []
  for c in chunks:
    for ch in c["choices"]:
      if ch["index"] == index:
        out.append(ch["text"] if "text" in ch else ch["delta"].get("content") or "")
  return "".join(out)


def test_text_that_may_start_a_stop_string_waits_and_the_pieces_join(tok):
  s = openai_stream.Streamer(_req(tok, stop=["STOP"]), "r", tok)
  ids = tok.encode("one two ST")
  sent = s.progress(0, 0, ids)
  assert _text(sent) == "one two "                      # "ST" may begin "STOP": held
  later = s.progress(0, 0, tok.encode("one two STAR"))   # it did not
  assert _text(later) == "STAR"
  assert s.progress(0, 0, tok.encode("one two STAR")) == []   # nothing new, no chunk
  end = s.finish(_body("completion", ["one two STAR and"]))
  assert _text(sent + later + end) == "one two STAR and"
  assert end[-1]["choices"][0]["finish_reason"] == "stop"
  assert s.chunks_sent == 2


def test_an_incomplete_character_waits_for_its_last_byte(tok):
  ids = tok.encode("hi 🙂🙂")
  cuts = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd")]
  assert cuts, "the emoji must span several tokens for this test to mean anything"
  s = openai_stream.Streamer(_req(tok), "r", tok)
  chunks = []
  for k in range(1, len(ids) + 1):
    chunks += s.progress(0, 0, ids[:k])
  assert all("\ufffd" not in _text([c]) for c in chunks)
  assert _text(chunks) == "hi 🙂🙂"


def test_chat_choices_open_with_the_role_and_are_indexed_job_times_n(tok):
  req = _req(tok, "chat", n=2, stream_options={"include_usage": True})
  s = openai_stream.Streamer(req, "r", tok)
  a = s.progress(0, 1, tok.encode("second"))
  assert a[0]["choices"][0] == {"index": 1, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}
  assert a[0]["object"] == "chat.completion.chunk"
  end = s.finish(_body("chat", ["first", "second one"], finish="length"))
  assert _text(a + end, 0) == "first" and _text(a + end, 1) == "second one"
  roles = [c["choices"][0]["index"] for c in a + end
           if c["choices"] and c["choices"][0]["delta"].get("role")]
  assert sorted(roles) == [0, 1]                     # once per choice
  assert end[-1]["choices"] == [] and end[-1]["usage"]["total_tokens"] == 2
