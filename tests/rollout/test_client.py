"""SGLangClient: rlpt requests through a real EngineServer (tiny model, real JaxEngine),
retries on transient failures only, per-request timeouts, clear 4xx errors.

The flaky upstreams below are small aiohttp apps that answer like an overloaded or
slow SGLang server (503s, stalls); they test the client's retry policy, not a model.
"""

import asyncio
import time

import numpy as np
import pytest
from aiohttp import web

from rlpt.rollout import GenerateRequest, JaxEngine, SamplingParams, SGLangClient
from rlpt.rollout.client import SGLangRequestError, SGLangUnavailable
from tests.rollout import serving


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


@pytest.fixture(scope="module")
def srv(tok):
  engine = JaxEngine(serving.tiny_model(tok, seed=3), tok, serving.tiny_engine_config())
  s = serving.InProcessServer(engine, tok)
  yield s
  s.close()


def test_generate_requests_match_the_engine(srv, tok):
  reqs = [GenerateRequest(prompt_ids=tuple(tok.encode("one two three")), n=2,
                          sampling=SamplingParams(max_new_tokens=8, temperature=1.0, seed=11),
                          request_id="r0"),
          GenerateRequest(text="Hello world", sampling=SamplingParams(max_new_tokens=8,
                                                                      temperature=0.0)),
          GenerateRequest(messages=({"role": "user", "content": "Hi"},),
                          sampling=SamplingParams(max_new_tokens=8, temperature=0.0))]

  async def go():
    async with SGLangClient(srv.url, tokenizer=tok) as c:
      return await c.generate_requests(reqs)

  got = asyncio.run(go())
  as_ids = [GenerateRequest(prompt_ids=tuple(tok.encode(r.text)), sampling=r.sampling)
            if r.text is not None else r for r in reqs]
  as_ids[2] = GenerateRequest(prompt_ids=tuple(tok.encode(tok.apply_chat_template(
      list(reqs[2].messages), add_generation_prompt=True))), sampling=reqs[2].sampling)
  want = srv.engine.generate(as_ids)
  assert len(got) == len(want) == 4
  for g, w in zip(got, want):
    assert g.token_ids == w.token_ids and g.text == w.text
    assert g.prompt_ids == w.prompt_ids
    assert g.finish_reason == w.finish_reason
    assert g.weight_version == srv.engine.weight_version
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    np.testing.assert_allclose(g.sampling_logprobs, w.sampling_logprobs, atol=1e-5)
  assert [(g.request_id, g.sample_index) for g in got[:2]] == [("r0", 0), ("r0", 1)]


def test_wall_cap_crosses_the_wire_and_comes_back_as_time(srv, tok):
  # rlpt's own key: the server cuts the sample at its first host check past the cap
  # and answers a length finish with cap "max_wall_s", which the client reads as "time".
  def req(cap):
    return GenerateRequest(prompt_ids=tuple(tok.encode("one two three")), sampling=SamplingParams(
        max_new_tokens=120, ignore_eos=True, seed=4, max_wall_s=cap))

  async def go(r):
    async with SGLangClient(srv.url, tokenizer=tok) as c:
      return (await c.generate_requests([r]))[0]

  cut, full = asyncio.run(go(req(1e-6))), asyncio.run(go(req(None)))
  assert cut.finish_reason == "time" and full.finish_reason == "length"
  assert 0 < len(cut.token_ids) < 120 == len(full.token_ids)
  assert cut.token_ids == full.token_ids[:len(cut.token_ids)]


def test_messages_without_tokenizer_is_a_clear_error(srv):
  async def go():
    async with SGLangClient(srv.url) as c:
      await c.generate_one(GenerateRequest(messages=({"role": "user", "content": "x"},)))
  with pytest.raises(ValueError, match="tokenizer"):
    asyncio.run(go())


def test_4xx_raises_at_once_with_the_server_message(srv):
  async def go():
    async with SGLangClient(srv.url, max_retries=5, backoff_s=1.0) as c:
      t0 = time.perf_counter()
      with pytest.raises(SGLangRequestError) as e:
        await c.generate({"text": "x", "sampling_params": {"temperature": -1}})
      return e.value, time.perf_counter() - t0
  err, secs = asyncio.run(go())
  assert err.status == 400 and "temperature" in err.message
  assert secs < 1.0  # no backoff: a 4xx is never retried


class Flaky:
  """An upstream that fails `fail` times (503 or a stall) and then answers 200."""

  def __init__(self, fail: int, mode: str = "503"):
    self.fail, self.mode, self.hits = fail, mode, 0

  async def handle(self, request):
    self.hits += 1
    if self.hits <= self.fail:
      if self.mode == "stall":
        await asyncio.sleep(2)
      return web.json_response({"error": {"message": "overloaded"}}, status=503)
    return web.json_response({"text": "ok", "output_ids": [1], "meta_info": {}})

  async def __aenter__(self):
    app = web.Application()
    app.router.add_post("/generate", self.handle)
    self.runner = web.AppRunner(app)
    await self.runner.setup()
    self.port = serving.free_port()
    await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
    return f"http://127.0.0.1:{self.port}"

  async def __aexit__(self, *exc):
    await self.runner.cleanup()


def test_transient_503s_are_retried_with_backoff():
  async def go():
    flaky = Flaky(fail=2)
    async with flaky as url, SGLangClient(url, max_retries=3, backoff_s=0.05) as c:
      out = await c.generate({"text": "x"})
    return out, flaky.hits
  out, hits = asyncio.run(go())
  assert out["text"] == "ok" and hits == 3


def test_retries_run_out_with_a_clear_error():
  async def go():
    flaky = Flaky(fail=10)
    async with flaky as url, SGLangClient(url, max_retries=2, backoff_s=0.01) as c:
      with pytest.raises(SGLangUnavailable, match="3 attempt.*HTTP 503: overloaded"):
        await c.generate({"text": "x"})
    return flaky.hits
  assert asyncio.run(go()) == 3


def test_per_request_timeout_counts_as_transient():
  async def go():
    flaky = Flaky(fail=1, mode="stall")
    async with flaky as url, SGLangClient(url, max_retries=1, backoff_s=0.01) as c:
      t0 = time.perf_counter()
      out = await c.generate({"text": "x"}, timeout_s=0.5)
      secs = time.perf_counter() - t0
    return out, flaky.hits, secs
  out, hits, secs = asyncio.run(go())
  assert out["text"] == "ok" and hits == 2 and secs < 3.0


def test_connection_refused_is_unavailable():
  port = serving.free_port()  # nothing listens there

  async def go():
    async with SGLangClient(f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.01) as c:
      assert not await c.health()
      with pytest.raises(SGLangUnavailable, match="3 attempt"):
        await c.get_model_info()
  asyncio.run(go())


def test_pooled_concurrent_requests(srv, tok):
  async def go():
    async with SGLangClient(srv.url, max_connections=4) as c:
      reqs = [GenerateRequest(prompt_ids=tuple(tok.encode(f"count {i}")),
                              sampling=SamplingParams(max_new_tokens=4, temperature=0.0))
              for i in range(12)]
      return await c.generate_requests(reqs), c
  comps, c = asyncio.run(go())
  assert len(comps) == 12 and all(len(x.token_ids) >= 1 for x in comps)


def test_health_is_answered_while_generations_hold_every_connection():
  """Control calls have their own pool: with every /generate connection held by a
  long generation, /health still answers at once (a fleet member busy with a
  holdout's queue is not down)."""
  async def go():
    async def slow(request):
      await asyncio.sleep(3.0)
      return web.json_response({"text": "ok", "output_ids": [1], "meta_info": {}})

    async def health(request):
      return web.Response(status=200)
    app = web.Application()
    app.router.add_post("/generate", slow)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = serving.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
      async with SGLangClient(f"http://127.0.0.1:{port}", max_connections=2,
                              max_retries=0) as c:
        gens = [asyncio.ensure_future(c.generate({"text": "x"})) for _ in range(4)]
        await asyncio.sleep(0.3)          # both pooled connections are in use
        t0 = time.perf_counter()
        ok = await c.health(timeout_s=1.0)
        secs = time.perf_counter() - t0
        outs = await asyncio.gather(*gens)
    finally:
      await runner.cleanup()
    return ok, secs, outs
  ok, secs, outs = asyncio.run(go())
  assert ok and secs < 0.5, secs
  assert [o["text"] for o in outs] == ["ok"] * 4
