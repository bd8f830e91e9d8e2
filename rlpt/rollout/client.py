"""An async client for SGLang's native HTTP API (a real SGLang server or launch.serve).

    async with SGLangClient("http://127.0.0.1:30000") as c:
      await c.wait_healthy(timeout_s=60)
      completions = await c.generate_requests([GenerateRequest(text="Hi", n=4)])
      await c.update_weights_from_disk("/run/weights/v3", weight_version=3)

One `aiohttp.ClientSession` per client keeps a pool of keep-alive connections for
/generate; control calls (/health, model and server info, weight updates, cache
flushes) go through a second small pool, so they never queue behind a flood of
long generations holding every connection (a 1,200-task holdout sends them all).
Every call has its own timeout. Transient failures (connection refused or reset,
server disconnects, timeouts, HTTP 408/429/500/502/503/504) are retried with
exponential backoff and jitter; a 4xx answer is never retried and raises
`SGLangRequestError` carrying the server's message. When the retries run out,
`SGLangUnavailable` says which URL and why.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, Sequence

import aiohttp

from rlpt.rollout.engine import Completion, GenerateRequest

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
GENERATION_PATHS = frozenset({"/generate", "/tokenize", "/detokenize"})
CONTROL_CONNECTIONS = 4   # the control pool: /health, info, weight updates, flushes
# SGLang's sampling_params default for top_k is "all tokens"; -1 says that on the wire.
_TOP_K_ALL = -1


class SGLangError(RuntimeError):
  """Base class of the client's errors."""


class SGLangRequestError(SGLangError):
  """The server refused the request (HTTP 4xx); retrying would not help."""

  def __init__(self, status: int, message: str, url: str):
    super().__init__(f"{url} answered HTTP {status}: {message}")
    self.status = status
    self.message = message
    self.url = url


class SGLangUnavailable(SGLangError):
  """The server could not be reached (or kept failing) after every retry."""

  def __init__(self, url: str, attempts: int, last: str):
    super().__init__(f"{url} unavailable after {attempts} attempt(s): {last}")
    self.url = url
    self.attempts = attempts


def error_message(payload: Any) -> str:
  """The human message inside any of SGLang's error bodies.

  SGLang answers {"error": {"message": ...}}, {"error": "..."}, the OpenAI-style
  {"object": "error", "message": ...} or {"success": false, "message": ...}.
  """
  if isinstance(payload, dict):
    err = payload.get("error")
    if isinstance(err, dict) and "message" in err:
      return str(err["message"])
    if isinstance(err, str):
      return err
    if "message" in payload:
      return str(payload["message"])
    if "detail" in payload:
      return str(payload["detail"])
  return str(payload)


def native_sampling_params(request: GenerateRequest) -> dict[str, Any]:
  """`request.sampling` as SGLang's `sampling_params` JSON (n included)."""
  sp = request.sampling
  out: dict[str, Any] = {
      "max_new_tokens": sp.max_new_tokens,
      "temperature": sp.temperature,
      "top_p": sp.top_p,
      "top_k": sp.top_k if sp.top_k > 0 else _TOP_K_ALL,
      "ignore_eos": sp.ignore_eos,
      "n": request.n,
  }
  if sp.stop:
    out["stop"] = list(sp.stop)
  if sp.stop_token_ids:
    out["stop_token_ids"] = list(sp.stop_token_ids)
  if sp.seed is not None:
    out["sampling_seed"] = int(sp.seed)
  if sp.max_wall_s is not None:  # rlpt's own key (launch.serve); SGLang would refuse it
    out["max_wall_s"] = float(sp.max_wall_s)
  return out


def _version(v: Any, default: int) -> int:
  try:
    return int(v)
  except (TypeError, ValueError):
    return default


def completions_from_response(request: GenerateRequest, outputs: Sequence[dict[str, Any]],
                              request_id: str, default_version: int = 0) -> list[Completion]:
  """Turns the n native outputs of one prompt into `Completion`s.

  Reads `output_ids`, `text`, `meta_info.finish_reason`, `meta_info.weight_version`
  (SGLang keeps it as a string; a non-integer such as SGLang's "default" becomes
  `default_version`), `meta_info.output_token_logprobs`, rlpt's
  `meta_info.output_token_weight_versions` (a partial rollout) and `prompt_token_ids`.
  """
  comps = []
  for j, out in enumerate(outputs):
    meta = out.get("meta_info", {})
    fr = meta.get("finish_reason") or {}
    kind = fr.get("type", "length") if isinstance(fr, dict) else str(fr)
    if kind not in ("stop", "length", "abort"):
      kind = "abort"
    if kind == "length" and isinstance(fr, dict) and fr.get("cap") == "max_wall_s":
      kind = "time"
    lps = meta.get("output_token_logprobs") or []
    logprobs = [float(x[0]) if x[0] is not None else 0.0 for x in lps]
    prompt_ids = out.get("prompt_token_ids")
    if prompt_ids is None:
      prompt_ids = list(request.prompt_ids) if request.prompt_ids is not None else []
    sampling_lps = meta.get("output_token_sampling_logprobs")
    comps.append(Completion(
        request_id=request_id, sample_index=j, prompt_ids=list(prompt_ids),
        token_ids=list(out.get("output_ids") or []), text=out.get("text") or "",
        logprobs=logprobs,
        sampling_logprobs=([float(x) for x in sampling_lps] if sampling_lps is not None
                           else list(logprobs)),
        finish_reason=kind,
        weight_version=_version(meta.get("weight_version"), default_version),
        token_versions=([int(v) for v in meta["output_token_weight_versions"]]
                        if meta.get("output_token_weight_versions") is not None else None)))
  return comps


class SGLangClient:
  """Async client of one SGLang-native server.

  Args:
    base_url: e.g. "http://127.0.0.1:30000".
    timeout_s: default per-request timeout (each call may pass its own).
    max_retries: extra attempts after a transient failure (0 = try once).
    backoff_s: first backoff; doubles each retry up to `max_backoff_s`, with
      +-50 % jitter.
    max_connections: size of the connection pool.
    tokenizer: optional; renders `GenerateRequest.messages` with its chat
      template (SGLang's /generate takes text or ids, not messages).
    api_key: sent as a Bearer token when given.
  """

  def __init__(self, base_url: str, *, timeout_s: float = 600.0, max_retries: int = 3,
               backoff_s: float = 0.25, max_backoff_s: float = 5.0, max_connections: int = 64,
               tokenizer: Any = None, api_key: str | None = None):
    self.base_url = base_url.rstrip("/")
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_backoff_s = max_backoff_s
    self.max_connections = max_connections
    self.tokenizer = tokenizer
    self.api_key = api_key
    self._session: aiohttp.ClientSession | None = None
    self._control: aiohttp.ClientSession | None = None
    self._counter = 0

  async def __aenter__(self) -> "SGLangClient":
    return self

  async def __aexit__(self, *exc) -> None:
    await self.close()

  def _new_session(self, limit: int) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 headers=headers, timeout=aiohttp.ClientTimeout(total=None))

  def _get_session(self, control: bool = False) -> aiohttp.ClientSession:
    if control:
      if self._control is None or self._control.closed:
        self._control = self._new_session(CONTROL_CONNECTIONS)
      return self._control
    if self._session is None or self._session.closed:
      self._session = self._new_session(self.max_connections)
    return self._session

  async def close(self) -> None:
    for s in (self._session, self._control):
      if s is not None and not s.closed:
        await s.close()
    self._session = self._control = None

  async def request(self, method: str, path: str, payload: Any = None, *,
                    timeout_s: float | None = None, retries: int | None = None,
                    control: bool | None = None) -> Any:
    """One HTTP call with retries; returns the parsed JSON (or text) body. `control`
    (default: every path but /generate and the OpenAI routes) takes the control pool.

    Raises:
      SGLangRequestError: on a 4xx answer (not retried).
      SGLangUnavailable: when every attempt failed transiently.
    """
    url = self.base_url + path
    if control is None:
      control = path not in GENERATION_PATHS and not path.startswith("/v1/")
    retries = self.max_retries if retries is None else retries
    timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
    last = ""
    for attempt in range(retries + 1):
      if attempt:
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))
      try:
        async with self._get_session(control).request(method, url, json=payload,
                                               timeout=timeout) as resp:
          raw = await resp.read()
          body: Any = raw.decode("utf-8", "replace")
          try:
            body = json.loads(body) if body else None
          except json.JSONDecodeError:
            pass
          if resp.status < 400:
            return body
          if resp.status in TRANSIENT_STATUS:
            last = f"HTTP {resp.status}: {error_message(body)}"
            continue
          raise SGLangRequestError(resp.status, error_message(body), url)
      except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
              asyncio.TimeoutError) as e:
        last = f"{type(e).__name__}: {e}"
    raise SGLangUnavailable(url, retries + 1, last)

  # --- SGLang's native endpoints -------------------------------------------

  async def health(self, *, timeout_s: float = 5.0) -> bool:
    """True when GET /health answers 200 (one attempt, no retries)."""
    try:
      await self.request("GET", "/health", timeout_s=timeout_s, retries=0)
      return True
    except SGLangError:
      return False

  async def wait_healthy(self, timeout_s: float = 120.0, poll_s: float = 0.25) -> None:
    """Polls /health until it answers 200; raises SGLangUnavailable at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
      if await self.health(timeout_s=min(5.0, timeout_s)):
        return
      await asyncio.sleep(poll_s)
    raise SGLangUnavailable(self.base_url + "/health", -1, f"not healthy within {timeout_s} s")

  async def get_model_info(self, **kw) -> dict[str, Any]:
    return await self.request("GET", "/get_model_info", **kw)

  async def server_info(self, **kw) -> dict[str, Any]:
    return await self.request("GET", "/server_info", **kw)

  async def flush_cache(self, **kw) -> Any:
    return await self.request("POST", "/flush_cache", **kw)

  async def weight_version(self, **kw) -> str | None:
    """The server's current weight version as it reports it (a string in SGLang)."""
    info = await self.get_model_info(**kw)
    return info.get("weight_version")

  async def update_weights_from_disk(self, model_path: str, *,
                                     weight_version: int | str | None = None,
                                     abort_all_requests: bool = False,
                                     continue_requests: bool = False,
                                     load_format: str | None = None,
                                     timeout_s: float | None = None) -> dict[str, Any]:
    """POST /update_weights_from_disk; returns {"success", "message", "num_paused_requests"}.

    `continue_requests` (an rlpt server extension): load now, and let running requests
    continue under the new weights (partial rollouts) instead of finishing on the old
    ones first. A refused update (missing or incompatible weights) raises
    SGLangRequestError; the server keeps serving its previous weights.
    """
    payload: dict[str, Any] = {"model_path": model_path, "abort_all_requests": abort_all_requests}
    if continue_requests:
      payload["continue_requests"] = True
    if weight_version is not None:
      payload["weight_version"] = str(weight_version)
    if load_format is not None:
      payload["load_format"] = load_format
    return await self.request("POST", "/update_weights_from_disk", payload,
                              timeout_s=timeout_s, retries=0)

  async def generate(self, payload: dict[str, Any], *, timeout_s: float | None = None) -> Any:
    """POST /generate with a native payload; returns the raw JSON (dict or list)."""
    return await self.request("POST", "/generate", payload, timeout_s=timeout_s)

  # --- rlpt's request/completion types ---------------------------------------

  def to_payload(self, request: GenerateRequest, rid: str) -> dict[str, Any]:
    """The native /generate body for one `GenerateRequest` (all n samples)."""
    payload: dict[str, Any] = {"sampling_params": native_sampling_params(request), "rid": rid,
                               "return_logprob": True, "return_prompt_token_ids": True}
    if request.prompt_ids is not None:
      payload["input_ids"] = [int(t) for t in request.prompt_ids]
    elif request.text is not None:
      payload["text"] = request.text
    else:
      if self.tokenizer is None:
        raise ValueError(f"request {rid}: chat messages need SGLangClient(tokenizer=...) to render "
                         "the chat template; SGLang's /generate takes text or input_ids")
      payload["text"] = self.tokenizer.apply_chat_template(list(request.messages),
                                                           add_generation_prompt=True)
    return payload

  async def generate_one(self, request: GenerateRequest, *, timeout_s: float | None = None,
                         default_version: int = 0) -> list[Completion]:
    """Samples the request's n completions (in sample order)."""
    self._counter += 1
    rid = request.request_id or f"req-{id(self):x}-{self._counter}"
    out = await self.generate(self.to_payload(request, rid), timeout_s=timeout_s)
    outputs = out if isinstance(out, list) else [out]
    if len(outputs) != request.n:
      raise SGLangError(f"{self.base_url}/generate returned {len(outputs)} outputs for "
                        f"request {rid} with n={request.n}")
    return completions_from_response(request, outputs, rid, default_version)

  async def generate_requests(self, requests: Sequence[GenerateRequest], *,
                              timeout_s: float | None = None) -> list[Completion]:
    """Sends every request concurrently; completions grouped by request, in order."""
    groups = await asyncio.gather(*(self.generate_one(r, timeout_s=timeout_s) for r in requests))
    return [c for g in groups for c in g]
