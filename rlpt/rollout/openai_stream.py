"""Incremental Server-Sent Events for the OpenAI routes (`stream: true`).

While the engine decodes, `Streamer.progress` turns a sample's tokens so far into
the text not yet sent, in OpenAI's chunk shapes (`text_completion` chunks with
`text`, or `chat.completion.chunk` with `delta`); `Streamer.finish` sends what the
finished completion adds, one closing chunk per choice (its `finish_reason`, and
rlpt's `token_ids` extension) and the usage chunk when asked for. The texts of a
choice's chunks join to the non-streaming answer's text:

- text that ends in an incomplete UTF-8 character (the decoder's U+FFFD) waits for
  the token that completes it;
- text that could be the start of a stop string waits until it is known not to be
  (the finished text is cut before the stop string);
- a choice's first chunk (chat) carries `role: "assistant"`.

Choice index = job index x n + sample index, as in the non-streaming answer.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from absl import logging

from rlpt.rollout.openai_api import OpenAIRequest


def _held_back(text: str, stops: Sequence[str]) -> int:
  """Characters at the end of `text` that may begin a stop string."""
  hold = 0
  for s in stops:
    for k in range(min(len(s) - 1, len(text)), hold, -1):
      if text.endswith(s[:k]):
        hold = k
        break
  return hold


class Streamer:
  """The chunks of one streamed request, as generation goes on."""

  def __init__(self, req: OpenAIRequest, rid: str, tokenizer: Any):
    self.req, self.tokenizer = req, tokenizer
    self.chat = req.kind == "chat"
    obj = "chat.completion.chunk" if self.chat else "text_completion"
    self.base = {"id": rid, "object": obj, "created": int(time.time()), "model": req.model}
    self.sent: dict[int, str] = {}        # choice index -> text sent so far
    self.chunks_sent = 0                  # content chunks made by `progress`

  def _index(self, job: int, sample: int) -> int:
    return job * self.req.jobs[job].request.n + sample

  def _piece(self, index: int, text: str) -> list[dict[str, Any]]:
    out = []
    if self.chat and index not in self.sent:
      out.append(dict(self.base, choices=[{"index": index, "delta": {"role": "assistant",
                                                                      "content": ""},
                                           "logprobs": None, "finish_reason": None}]))
    self.sent.setdefault(index, "")
    if text:
      self.sent[index] += text
      c = ({"index": index, "delta": {"content": text}} if self.chat
           else {"index": index, "text": text})
      out.append(dict(self.base, choices=[dict(c, logprobs=None, finish_reason=None)]))
    return out

  def progress(self, job: int, sample: int, token_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Chunks for the text that `token_ids` (the sample's tokens so far) adds."""
    text = self.tokenizer.decode(list(token_ids))
    text = text.rstrip("\ufffd")
    text = text[:len(text) - _held_back(text, self.req.jobs[job].request.sampling.stop)]
    index = self._index(job, sample)
    sent = self.sent.get(index, "")
    if len(text) <= len(sent) or not text.startswith(sent):
      return []
    out = self._piece(index, text[len(sent):])
    self.chunks_sent += 1
    return out

  def finish(self, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The remaining chunks, given the finished response `body` (openai_api.answer's)."""
    out = []
    for ch in body["choices"]:
      index = ch["index"]
      text = ch["message"]["content"] if self.chat else ch["text"]
      sent = self.sent.get(index, "")
      if not text.startswith(sent):   # cannot happen by construction; never resend
        logging.warning("stream %s choice %d: sent %r is not a prefix of %r",
                        self.base["id"], index, sent, text)
        text = sent
      out += self._piece(index, text[len(sent):])
      last = ({"index": index, "delta": {}} if self.chat else {"index": index, "text": ""})
      last.update(logprobs=None, finish_reason=ch["finish_reason"], token_ids=ch["token_ids"])
      out.append(dict(self.base, choices=[last]))
    if self.req.include_usage:
      out.append(dict(self.base, choices=[], usage=body["usage"]))
    return out
