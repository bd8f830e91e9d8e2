"""A RolloutEngine served over SGLang's native HTTP API (aiohttp).

    server = EngineServer(engine, tokenizer, model_path="smollm2-135m-instruct")
    web.run_app(server.app(), host="127.0.0.1", port=30000)

Routes (as SGLang 0.5.x): POST /generate, POST /update_weights_from_disk,
GET /health (and /health_generate), GET /get_model_info (and /model_info),
GET /server_info (and /get_server_info), GET|POST /flush_cache; and OpenAI's
(rlpt.rollout.openai_api): GET /v1/models, POST /v1/completions, POST
/v1/chat/completions, POST /tokenize, POST /detokenize, GET /tokenizer_info.

Concurrency: requests are queued; one worker takes every queued /generate call
(up to `max_batch_prompts` prompts and, when set, `max_batch_samples` samples:
prompts x n) and runs them as one `engine.generate`
batch on a single device thread, so concurrent clients share decode batches.
A weight update is queued like work: what was queued before it finishes on the
old weights, what comes after runs on the new ones. With
`abort_all_requests: true` the update goes first instead: queued and running
requests are answered at once with finish_reason {"type": "abort"} (their
callers re-queue them) and the new weights load as soon as the device is free.
With `continue_requests: true` (an rlpt extension) the weights load at once on a
loader thread beside the running batch, which takes them up between decode chunks:
its requests go on under the new version (partial rollouts; each answer's
`output_token_weight_versions` says which version sampled each token).
A refused update (missing path, wrong shapes or vocabulary) answers 400 and the
server keeps serving its previous weights and version.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import inspect
import itertools
import json
import os
import random
import time
from typing import Any, Callable, Sequence

from absl import logging
from aiohttp import web

from rlpt.rollout import openai_routes, prompt_logprobs, sglang_api
from rlpt.rollout.engine import Completion, RolloutEngine

FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n")


@dataclasses.dataclass
class _Gen:
  jobs: list[sglang_api.PromptJob]
  future: asyncio.Future
  t0: float
  # OpenAI routes: answered with raw (completions, None, scored) per job, each
  # completion scored with the top `top_k` alternatives (None: no logprobs)
  raw: bool = False
  top_k: int | None = None
  # streaming: progress(job index, sample index, token ids so far), called on the loop
  progress: Callable[[int, int, list[int]], None] | None = None


@dataclasses.dataclass
class _Update:
  path: str
  version: int
  future: asyncio.Future
  aborted: int = 0


class EngineServer:
  """SGLang's native API in front of one RolloutEngine.

  Args:
    engine: the engine (e.g. JaxEngine).
    tokenizer: encodes text prompts, decodes token texts for logprob entries.
    weights: returns (ModelConfig, params) of the engine's current weights; used
      for input-token logprobs (`rlpt.models.token_logprobs`).
    load_weights: `(path, version) -> None`; swaps the engine's weights from a
      path (default: `engine.update_weights(path, version)`); must leave the old
      weights in place when it raises.
    model_path: what /get_model_info reports as model_path.
    max_context: prompt + max_new_tokens limit (tokens).
    default_max_new_tokens: used when a request leaves max_new_tokens null.
    max_batch_prompts: prompts per engine.generate batch.
    max_batch_samples: samples (each prompt's n) per engine.generate batch; 0 = no
      cap but max_batch_prompts. A fleet member caps both at one RL round's samples, so
      a round of n-sample groups and a holdout of n=1 prompts fill batches alike.
    server_args: extra fields for /server_info.
    seed: seeds the per-request seeds of requests that bring none.
    gather_quiet_s, gather_max_s: before it forms a batch the worker waits while
      requests keep arriving (each within gather_quiet_s of the one before, at most
      gather_max_s in all, never once the pending ones fill a batch). An RL round
      reaches a fleet member as one /generate per prompt a few ms apart; without the
      wait its first prompt ran alone and the rest waited for it (launch.bench
      fleet_rounds: with Fleet(batch_samples=) one engine batch a round instead of
      two, 1.11x on configs/default.py's rounds). 0 turns it off.
  """

  def __init__(self, engine: RolloutEngine, tokenizer: Any, *,
               weights: Callable[[], tuple[Any, Any]], vocab_size: int,
               model_path: str, max_context: int,
               load_weights: Callable[[str, int], Any] | None = None,
               served_model_name: str | None = None, default_max_new_tokens: int = 128,
               max_batch_prompts: int = 64, max_batch_samples: int = 0,
               server_args: dict[str, Any] | None = None, seed: int = 0,
               gather_quiet_s: float = 0.005, gather_max_s: float = 0.05):
    self.engine = engine
    self.tokenizer = tokenizer
    self.weights = weights
    self.vocab_size = vocab_size
    self.model_path = model_path
    self.served_model_name = served_model_name or model_path
    self.max_context = max_context
    self.default_max_new_tokens = default_max_new_tokens
    self.max_batch_prompts = max_batch_prompts
    self.max_batch_samples = max_batch_samples
    self.gather_quiet_s, self.gather_max_s = gather_quiet_s, gather_max_s
    self.server_args = dict(server_args or {})
    self.load_weights = load_weights or (lambda path, v: engine.update_weights(path, v))
    self._pending: collections.deque = collections.deque()
    self._running: list[_Gen] = []
    self._wake: asyncio.Event | None = None
    self._device = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlpt-device")
    # continue_requests updates load here, beside the device thread's batch
    self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlpt-loader")
    params = inspect.signature(engine.generate).parameters
    self._adopts, self._streams = "adopt_weights" in params, "on_tokens" in params
    self._worker_task: asyncio.Task | None = None
    self._counter = 0
    self._rng = random.Random(seed)
    self.startup_time = time.time()
    self.stats = collections.Counter()

  # --- app -------------------------------------------------------------------

  def app(self) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    r = app.router
    for path in ("/generate",):
      r.add_post(path, self._generate)
      r.add_put(path, self._generate)
    r.add_post("/update_weights_from_disk", self._update_weights)
    for path in ("/health", "/health_generate"):
      r.add_get(path, self._health)
    for path in ("/get_model_info", "/model_info"):
      r.add_get(path, self._model_info)
    for path in ("/server_info", "/get_server_info"):
      r.add_get(path, self._server_info)
    r.add_get("/flush_cache", self._flush_cache)
    r.add_post("/flush_cache", self._flush_cache)
    openai_routes.OpenAIRoutes(self).add_to(r)   # /v1/..., /tokenize, ... (OpenAI's API)
    app.on_startup.append(self._start)
    app.on_cleanup.append(self._stop)
    return app

  async def _start(self, app) -> None:
    self._wake = asyncio.Event()
    self._worker_task = asyncio.get_running_loop().create_task(self._worker())

  async def _stop(self, app) -> None:
    if self._worker_task is not None:
      self._worker_task.cancel()
    self._device.shutdown(wait=False, cancel_futures=True)
    self._loader.shutdown(wait=False, cancel_futures=True)

  # --- handlers ----------------------------------------------------------------

  async def _json(self, request: web.Request) -> Any:
    try:
      return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      body = sglang_api.validation_error_body(f"the request body is not valid JSON: {e}")
      raise web.HTTPBadRequest(text=json.dumps(body), content_type="application/json")

  async def _generate(self, request: web.Request) -> web.Response:
    body = await self._json(request)
    self._counter += 1
    try:
      jobs, single = sglang_api.parse_generate(
          body, self.tokenizer, vocab_size=self.vocab_size, max_context=self.max_context,
          default_max_new_tokens=self.default_max_new_tokens, rid_prefix=f"rlpt-{self._counter}")
    except sglang_api.ApiError as e:
      self.stats["refused"] += 1
      return web.json_response(sglang_api.error_body(str(e)), status=e.status)
    for j in jobs:  # like SGLang, a request without a seed gets fresh randomness
      if j.request.sampling.seed is None:
        sampling = dataclasses.replace(j.request.sampling, seed=self._rng.getrandbits(31))
        j.request = dataclasses.replace(j.request, sampling=sampling)
    fut = asyncio.get_running_loop().create_future()
    self._pending.append(_Gen(jobs, fut, time.perf_counter()))
    self._wake.set()
    try:
      answers = await fut
    except sglang_api.ApiError as e:
      return web.json_response(sglang_api.error_body(str(e)), status=e.status)
    flat = [a for group in answers for a in group]
    return web.json_response(flat[0] if single else flat)

  async def submit(self, jobs: list[sglang_api.PromptJob], *, top_k: int | None = None,
                   progress: Callable[[int, int, list[int]], None] | None = None
                   ) -> list[tuple[list[Completion], Any, Any]]:
    """Queues `jobs` like a /generate call; per job, (its n completions, None, its
    completions' top-`top_k` scoring or None). Jobs without a seed get a fresh one.
    `progress(job index, sample index, token ids so far)` is called on the event loop
    while the engine decodes (engines whose generate takes `on_tokens`), before this
    returns. Raises sglang_api.ApiError when the engine refuses them."""
    for j in jobs:
      if j.request.sampling.seed is None:
        sampling = dataclasses.replace(j.request.sampling, seed=self._rng.getrandbits(31))
        j.request = dataclasses.replace(j.request, sampling=sampling)
    fut = asyncio.get_running_loop().create_future()
    self._pending.append(_Gen(jobs, fut, time.perf_counter(), raw=True, top_k=top_k,
                              progress=progress))
    self._wake.set()
    return await fut

  def next_id(self) -> int:
    self._counter += 1
    return self._counter

  async def _update_weights(self, request: web.Request) -> web.Response:
    body = await self._json(request)
    fail = lambda msg: web.json_response(
        {"success": False, "message": msg, "num_paused_requests": 0}, status=400)
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
      return fail("the body must be a JSON object with a string field 'model_path'")
    path = body["model_path"]
    raw = body.get("weight_version")
    try:
      version = self.engine.weight_version + 1 if raw is None else int(raw)
    except (TypeError, ValueError):
      return fail(f"weight_version must be an integer (as a string or number), got {raw!r}")
    if not os.path.exists(path):
      return fail(f"model_path '{path}' does not exist; still serving weight version "
                  f"{self.engine.weight_version}")
    upd = _Update(path, version, asyncio.get_running_loop().create_future())
    done = upd.future
    if body.get("continue_requests") and self._adopts:
      # partial rollouts: load beside the running batch, which takes the new weights up
      # between decode chunks (JaxEngine.generate(adopt_weights=True))
      done = asyncio.get_running_loop().run_in_executor(self._loader, self._timed_load, path,
                                                        version)
    elif body.get("abort_all_requests"):
      upd.aborted = self._abort_all()
      self._pending.appendleft(upd)
      self._wake.set()
    else:
      self._pending.append(upd)
      self._wake.set()
    try:
      seconds = await done
    except Exception as e:  # noqa: BLE001 -- any load failure is refused, old weights kept
      logging.warning("refused weights %s: %s", path, e)
      return fail(f"failed to load weights from '{path}' ({type(e).__name__}: {e}); still "
                  f"serving weight version {self.engine.weight_version}")
    return web.json_response({
        "success": True,
        "message": f"Succeeded to update model weights from {path} (weight version {version}, "
                   f"{seconds:.3f} s).",
        "num_paused_requests": upd.aborted})

  async def _health(self, request: web.Request) -> web.Response:
    return web.Response(status=200 if self._worker_task is not None else 503)

  def model_info(self) -> dict[str, Any]:
    return {
        "model_path": self.model_path,
        "served_model_name": self.served_model_name,
        "tokenizer_path": self.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": str(self.engine.weight_version),
        "load_format": "orbax",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(self.weights()[0], "arch", None),
    }

  async def _model_info(self, request: web.Request) -> web.Response:
    return web.json_response(self.model_info())

  async def _server_info(self, request: web.Request) -> web.Response:
    return web.json_response({
        **self.server_args,
        "model_path": self.model_path,
        "context_length": self.max_context,
        "max_batch_prompts": self.max_batch_prompts,
        "max_batch_samples": self.max_batch_samples,
        "weight_version": str(self.engine.weight_version),
        "internal_states": [{"pending": len(self._pending),
                             "running": sum(len(g.jobs) for g in self._running),
                             **dict(self.stats)}],
        "startup_time": self.startup_time,
        "version": "rlpt",
        "frontend": "rlpt.rollout.server (aiohttp)",
    })

  async def _flush_cache(self, request: web.Request) -> web.Response:
    # JaxEngine keeps no KV across calls, so there is nothing to flush.
    return web.Response(text=FLUSH_OK)

  # --- the device worker ------------------------------------------------------

  def _timed_load(self, path: str, version: int) -> float:
    """Loads `path` as `version` (on the device or the loader thread): wall seconds."""
    t0 = time.perf_counter()
    self.load_weights(path, version)
    self.stats["weight_updates"] += 1
    return time.perf_counter() - t0

  def _abort_all(self) -> int:
    """Answers every queued and running /generate with finish_reason abort."""
    victims = list(self._running) + [w for w in self._pending if isinstance(w, _Gen)]
    self._pending = collections.deque(w for w in self._pending if not isinstance(w, _Gen))
    version = self.engine.weight_version
    for g in victims:
      if not g.future.done():
        empty = [[self._empty(j, k, version, "abort") for k in range(j.request.n)]
                 for j in g.jobs]
        g.future.set_result([(e, None, None) for e in empty] if g.raw else
                            [self._answer(j, e, None, g.t0) for j, e in zip(g.jobs, empty)])
    self.stats["aborted"] += sum(len(g.jobs) for g in victims)
    return sum(len(g.jobs) for g in victims)

  def _empty(self, job, k: int, version: int, reason: str) -> Completion:
    return Completion(request_id=job.rid, sample_index=k, prompt_ids=job.prompt_ids, token_ids=[],
                      text="", logprobs=[], sampling_logprobs=[], finish_reason=reason,
                      weight_version=version)

  def _answer(self, job, comps, input_lp, t0) -> list[dict[str, Any]]:
    return sglang_api.answer(job, comps, self.tokenizer, input_lp, time.perf_counter() - t0)

  def _run(self, jobs: Sequence[sglang_api.PromptJob], top_k: dict[int, int] | None = None,
           progress: dict[int, Callable[[int, list[int]], None]] | None = None
           ) -> list[tuple[list[Completion], Any, Any]]:
    """Device thread: generates and scores a batch of jobs on the current weights.
    top_k: {id(job): k} of jobs whose completions are scored with their top-k
    alternatives (openai_api logprobs); their third element lists one
    (chosen, top_ids, top_lps) per completion. progress: {id(job): f(sample index,
    token ids so far)} of streamed jobs, called from this thread while decoding."""
    gen = [j for j in jobs if not j.score_only]
    reqs = [j.request for j in gen]
    kw: dict[str, Any] = {"adopt_weights": True} if self._adopts else {}
    if progress and self._streams:
      feeds = [progress.get(id(j)) for j in gen]
      kw["on_tokens"] = lambda r, k, toks: feeds[r] and feeds[r](k, toks)
    comps = self.engine.generate(reqs, **kw) if gen else []
    version = self.engine.weight_version
    scored = [j for j in jobs if j.wants_input_logprobs]
    lps = {}
    if scored:
      config, params = self.weights()
      for j, lp in zip(scored, prompt_logprobs.prompt_logprobs(config, params,
                                                       [j.prompt_ids for j in scored])):
        lps[id(j)] = lp
    out, at = [], 0
    for j in jobs:
      if j.score_only:
        group = [self._empty(j, k, version, "length") for k in range(j.request.n)]
      else:
        group = list(comps[at:at + j.request.n])
        at += j.request.n
      out.append((group, lps.get(id(j)), None))
    top_k = top_k or {}
    wanted = [(i, list(jobs[i].prompt_ids) + list(c.token_ids)) for i in range(len(jobs))
              if id(jobs[i]) in top_k for c in out[i][0]]
    if wanted:
      config, params = self.weights()
      res = prompt_logprobs.sequence_logprobs(config, params, [s for _, s in wanted],
                                              k=max(top_k.values()))
      for (i, _), r in zip(wanted, res):
        if out[i][2] is None:
          out[i] = (out[i][0], out[i][1], [])
        out[i][2].append(r)
    return out

  async def _worker(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      await self._wake.wait()
      if not self._pending:
        self._wake.clear()
        continue
      if isinstance(self._pending[0], _Gen):
        await self._gather()
        if not self._pending:  # an abort answered everything while we waited
          continue
      item = self._pending.popleft()
      if isinstance(item, _Update):
        try:
          item.future.set_result(await loop.run_in_executor(
              self._device, self._timed_load, item.path, item.version))
        except Exception as e:  # noqa: BLE001 -- reported to the caller
          item.future.set_exception(e)
        continue
      batch, prompts, samples = [item], len(item.jobs), self._samples(item)
      while (self._pending and isinstance(self._pending[0], _Gen)
             and prompts + len(self._pending[0].jobs) <= self.max_batch_prompts
             and (self.max_batch_samples <= 0
                  or samples + self._samples(self._pending[0]) <= self.max_batch_samples)):
        nxt = self._pending.popleft()
        batch.append(nxt)
        prompts += len(nxt.jobs)
        samples += self._samples(nxt)
      self._running = batch
      try:
        await self._run_batch(loop, batch)
      finally:
        self._running = []

  async def _gather(self) -> None:
    """Lets a burst of requests arrive before a batch is formed: waits while new
    requests keep coming (each within `gather_quiet_s` of the last), at most
    `gather_max_s`, and not once the pending requests fill a batch."""
    deadline = time.perf_counter() + self.gather_max_s
    while time.perf_counter() < deadline:
      gens = [g for g in itertools.takewhile(lambda x: isinstance(x, _Gen), self._pending)]
      if (sum(len(g.jobs) for g in gens) >= self.max_batch_prompts
          or (self.max_batch_samples > 0
              and sum(self._samples(g) for g in gens) >= self.max_batch_samples)):
        return
      seen = len(self._pending)
      await asyncio.sleep(self.gather_quiet_s)
      if len(self._pending) == seen:
        return

  @staticmethod
  def _samples(g: _Gen) -> int:
    return sum(1 if j.score_only else j.request.n for j in g.jobs)

  async def _run_batch(self, loop, batch: list[_Gen]) -> None:
    jobs = [j for g in batch for j in g.jobs]
    self.stats["batches"] += 1
    self.stats["batch_requests"] += len(batch)
    top_k = {id(j): g.top_k for g in batch if g.top_k is not None for j in g.jobs}
    progress = {id(j): functools.partial(self._feed, loop, g.progress, i)
                for g in batch if g.progress is not None for i, j in enumerate(g.jobs)}
    try:
      results = await loop.run_in_executor(self._device, self._run, jobs, top_k, progress)
    except ValueError as e:
      if len(batch) > 1:  # isolate the request the engine refused
        for g in batch:
          await self._run_batch(loop, [g])
        return
      if not batch[0].future.done():
        batch[0].future.set_exception(sglang_api.ApiError(str(e)))
      return
    except Exception as e:  # noqa: BLE001 -- every waiter must hear of it
      logging.exception("engine failure")
      for g in batch:
        if not g.future.done():
          g.future.set_exception(sglang_api.ApiError(f"engine failure: {type(e).__name__}: {e}",
                                                     status=500))
      return
    at = 0
    for g in batch:
      res = results[at:at + len(g.jobs)]
      at += len(g.jobs)
      self.stats["prompts"] += len(g.jobs)
      if not g.future.done():  # aborted requests were answered already
        g.future.set_result(res if g.raw else [self._answer(j, comps, lp, g.t0)
                                               for j, (comps, lp, _) in zip(g.jobs, res)])

  @staticmethod
  def _feed(loop, progress, job: int, sample: int, toks: list[int]) -> None:
    loop.call_soon_threadsafe(progress, job, sample, toks)

  def warmup(self) -> None:
    """Compiles a short generate and a prompt scoring before the server answers."""
    from rlpt.rollout.engine import GenerateRequest, SamplingParams
    ids = tuple(range(1, 9))
    self.engine.generate([GenerateRequest(prompt_ids=ids, sampling=SamplingParams(
        max_new_tokens=8, temperature=1.0, seed=0))])
    config, params = self.weights()
    prompt_logprobs.prompt_logprobs(config, params, [list(ids)])


def weight_loader(engine: Any, *, dtype: str = "float32") -> Callable[[str, int], Any]:
  """`(path, version)` loader for EngineServer: an Orbax params checkpoint is restored
  into the engine's shardings; an HF directory (config.json + safetensors, what
  SGLang loads) is read with `load_model` first. The engine checks every tensor's
  shape (vocabulary included) before swapping, so a bad path leaves it untouched."""
  def load(path: str, version: int):
    if os.path.isfile(os.path.join(path, "config.json")):
      from rlpt.models import load_model
      model, _ = load_model(path, dtype=dtype)
      return engine.update_weights(model, version)
    return engine.update_weights(path, version)
  return load
