"""OpenAI-compatible HTTP routes of the rollout server (EngineServer), beside SGLang's:
GET /v1/models, POST /v1/completions, POST /v1/chat/completions, POST /tokenize, POST
/detokenize, GET /tokenizer_info. Requests and answers are rlpt.rollout.openai_api's;
generation goes through the server's queue (`EngineServer.submit`), so OpenAI and
SGLang clients share decode batches; streamed requests get their text as it is decoded
(rlpt.rollout.openai_stream).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from rlpt.rollout import openai_api, openai_stream, sglang_api


class OpenAIRoutes:
  """The handlers, bound to one EngineServer."""

  def __init__(self, server: Any):
    self.server = server

  def add_to(self, router: Any) -> None:
    router.add_get("/v1/models", self._models)
    router.add_post("/v1/completions", self._completions)
    router.add_post("/v1/chat/completions", self._chat)
    router.add_post("/tokenize", self._tokenize)
    router.add_post("/detokenize", self._detokenize)
    router.add_get("/tokenizer_info", self._tokenizer_info)

  async def _oai_json(self, request: web.Request) -> Any:
    try:
      return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise openai_api.OpenAIError(f"the request body is not valid JSON: {e}")

  def _oai_error(self, e: sglang_api.ApiError) -> web.Response:
    self.server.stats["refused"] += 1
    return web.json_response(openai_api.error_body(e), status=e.status)

  async def _completions(self, request: web.Request) -> web.StreamResponse:
    return await self._openai(request, "completion")

  async def _chat(self, request: web.Request) -> web.StreamResponse:
    return await self._openai(request, "chat")

  async def _openai(self, request: web.Request, kind: str) -> web.StreamResponse:
    rid = f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-rlpt-{self.server.next_id()}"
    parse = openai_api.parse_completion if kind == "completion" else openai_api.parse_chat
    srv = self.server
    try:
      body = await self._oai_json(request)
      req = parse(body, srv.tokenizer, served_model=srv.served_model_name,
                  vocab_size=srv.vocab_size, max_context=srv.max_context, rid=rid)
      if req.stream:
        return await self._stream(request, req, rid)
      results = await srv.submit(req.jobs, top_k=req.logprobs)
    except sglang_api.ApiError as e:   # OpenAIError too: a refused request, or the engine's
      return self._oai_error(e)
    return web.json_response(self._answer(req, results, rid))

  def _answer(self, req: openai_api.OpenAIRequest, results, rid: str) -> dict[str, Any]:
    scored = {(i, k): openai_api.Scored(*sc) for i, (_, _, s) in enumerate(results)
              for k, sc in enumerate(s or ())}
    return openai_api.answer(req, [comps for comps, _, _ in results], scored,
                             self.server.tokenizer, rid)

  async def _stream(self, request: web.Request, req: openai_api.OpenAIRequest,
                    rid: str) -> web.StreamResponse:
    """Answers `req` with Server-Sent Events as the engine decodes. A refusal before
    the first chunk is a JSON error (raised); a failure after it ends the stream with
    an `{"error": ...}` event. A client that goes away does not stop the generation."""
    streamer = openai_stream.Streamer(req, rid, self.server.tokenizer)
    events: asyncio.Queue = asyncio.Queue()   # (job, sample, tokens) ..., then None
    done = asyncio.ensure_future(self.server.submit(
        req.jobs, top_k=req.logprobs, progress=lambda *a: events.put_nowait(a)))
    # progress calls reach the loop before the result does, so None comes last
    done.add_done_callback(lambda _: events.put_nowait(None))
    done.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved if we leave
    resp: web.StreamResponse | None = None

    async def send(chunks) -> None:
      nonlocal resp
      if resp is None:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
      for c in chunks:
        await resp.write(f"data: {json.dumps(c)}\n\n".encode())

    try:
      while (event := await events.get()) is not None:
        chunks = streamer.progress(*event)
        if chunks:
          await send(chunks)
      self.server.stats["stream_chunks_early"] += streamer.chunks_sent
      try:
        results = done.result()
      except sglang_api.ApiError as e:
        if resp is None:
          raise
        self.server.stats["refused"] += 1
        await resp.write(f"data: {json.dumps(openai_api.error_body(e))}\n\n".encode())
      else:
        await send(streamer.finish(self._answer(req, results, rid)))
      await resp.write(b"data: [DONE]\n\n")
      await resp.write_eof()
    except ConnectionResetError:   # the client left; the engine finishes on its own
      pass
    return resp

  async def _models(self, request: web.Request) -> web.Response:
    srv = self.server
    return web.json_response({"object": "list", "data": [{
        "id": srv.served_model_name, "object": "model", "created": int(srv.startup_time),
        "owned_by": "rlpt", "root": srv.model_path, "max_model_len": srv.max_context}]})

  async def _tokenize(self, request: web.Request) -> web.Response:
    try:
      body = await self._oai_json(request)
      if not isinstance(body, dict):
        raise openai_api.OpenAIError("the /tokenize body must be a JSON object")
      special = body.get("add_special_tokens", True)
      if "messages" in body:
        msgs = openai_api.parse_messages(body["messages"])
        try:
          ids = list(self.server.tokenizer.apply_chat_template(
              msgs, add_generation_prompt=bool(body.get("add_generation_prompt", True)),
              tokenize=True))
        except Exception as e:  # noqa: BLE001
          raise openai_api.OpenAIError(f"the chat template cannot render these messages: {e}",
                                       "messages") from e
      elif isinstance(body.get("prompt"), str):
        ids = list(self._encode(body["prompt"], bool(special)))
      else:
        raise openai_api.OpenAIError("give 'prompt' (a string) or 'messages'", "prompt")
    except sglang_api.ApiError as e:
      return self._oai_error(e)
    return web.json_response({"tokens": ids, "count": len(ids),
                              "max_model_len": self.server.max_context})

  def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
    try:
      return self.server.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except TypeError:   # a tokenizer without special-token handling (CharTokenizer)
      return self.server.tokenizer.encode(text)

  async def _detokenize(self, request: web.Request) -> web.Response:
    try:
      body = await self._oai_json(request)
      toks = body.get("tokens") if isinstance(body, dict) else None
      if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                               for t in toks):
        raise openai_api.OpenAIError("'tokens' must be a list of token ids", "tokens")
      bad = [t for t in toks if not 0 <= t < self.server.vocab_size]
      if bad:
        raise openai_api.OpenAIError(f"token ids {bad[:5]} are outside the vocabulary "
                                     f"[0, {self.server.vocab_size})", "tokens")
    except sglang_api.ApiError as e:
      return self._oai_error(e)
    return web.json_response({"prompt": self.server.tokenizer.decode(toks)})

  async def _tokenizer_info(self, request: web.Request) -> web.Response:
    special = dict(getattr(self.server.tokenizer, "special_tokens", {}) or {})
    return web.json_response({
        "tokenizer_class": type(self.server.tokenizer).__name__,
        "vocab_size": self.server.vocab_size, "model_max_length": self.server.max_context,
        "eos_token": special.get("eos_token"), "bos_token": special.get("bos_token"),
        "pad_token": special.get("pad_token"), "unk_token": special.get("unk_token"),
        "chat_template": getattr(self.server.tokenizer, "chat_template", None)})
