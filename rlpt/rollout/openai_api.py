"""OpenAI-compatible requests and answers for the rollout server, beside SGLang's API.

EngineServer routes (rlpt.rollout.server): GET /v1/models, POST /v1/completions, POST
/v1/chat/completions, POST /tokenize, POST /detokenize, GET /tokenizer_info. A request
becomes the same `sglang_api.PromptJob`s a /generate call does, so it shares the
server's queue and decode batches.

Completions: `prompt` as text, a list of texts, token ids or a list of token-id lists;
`max_tokens` (default 16, 0 allowed with `echo`), `temperature`, `top_p`, `top_k`
(extension), `n`, `seed`, `stop`, `logprobs` (top-k count), `echo` (the prompt's
tokens lead the text and the logprob arrays, its first token with no logprob),
`stream`. Chat completions: `messages` rendered with the model's chat template,
`max_tokens` / `max_completion_tokens`, the same sampling fields, `logprobs` +
`top_logprobs`, `stream` (+ `stream_options.include_usage`).

Logprobs are one scoring forward of prompt + completion (rlpt.rollout.prompt_logprobs
.sequence_logprobs), so a token's logprob and its top-k alternatives come from the same
numbers (a greedy token's logprob equals the largest top-k value exactly, which is how
lm-eval decides `is_greedy`).

Extension fields (rlpt): every choice carries `token_ids`, the sampled token ids, and
`prompt_token_ids`, the prompt's ids as the model saw them (for token-exact training
from another library), and `weight_version`, the weights that sampled it.

Streaming (`stream: true`) answers Server-Sent Events in OpenAI's chunk shapes as the
engine decodes (rlpt.rollout.openai_stream), `data: [DONE]` at the end; chunks carry
no logprobs (they are scored once the completion is finished).

Errors use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`, HTTP 400
(404 for an unknown model), naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

from rlpt.rollout.engine import CUT_AT_BUDGET, Completion, GenerateRequest, SamplingParams
from rlpt.rollout.sglang_api import ApiError, PromptJob

MAX_TOP_LOGPROBS = 20


class OpenAIError(ApiError):
  """A refused request: HTTP `status`, the offending field in `param`."""

  def __init__(self, message: str, param: str | None = None, status: int = 400,
               code: str | None = None):
    super().__init__(message, status)
    self.param, self.code = param, code


def error_body(e: OpenAIError | ApiError) -> dict[str, Any]:
  return {"error": {"message": str(e), "type": "invalid_request_error" if e.status < 500
                    else "server_error",
                    "param": getattr(e, "param", None), "code": getattr(e, "code", None)}}


@dataclasses.dataclass
class OpenAIRequest:
  """A parsed completions or chat request: one job per prompt, and how to answer."""
  kind: str                      # "completion" | "chat"
  model: str
  jobs: list[PromptJob]
  logprobs: int | None           # top-k count (completions), or top_logprobs (chat) when on
  echo: bool = False
  stream: bool = False
  include_usage: bool = False


_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop",
           "logprobs", "stream", "stream_options", "user", "presence_penalty",
           "frequency_penalty", "logit_bias", "ignore_eos"}
_COMPLETION = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT = _COMMON | {"messages", "top_logprobs", "max_completion_tokens", "response_format",
                   "tools", "tool_choice", "parallel_tool_calls"}


def _num(body, key, default, lo=None, hi=None):
  v = body.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise OpenAIError(f"'{key}' must be a number, got {v!r}", key)
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    raise OpenAIError(f"'{key}' must be in [{lo}, {hi}], got {v}", key)
  return v


def _int(body, key, default, lo=None):
  v = body.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, int):
    raise OpenAIError(f"'{key}' must be an integer, got {v!r}", key)
  if lo is not None and v < lo:
    raise OpenAIError(f"'{key}' must be at least {lo}, got {v}", key)
  return v


def _check_fields(body: Any, allowed: set[str], route: str) -> None:
  if not isinstance(body, dict):
    raise OpenAIError(f"the {route} body must be a JSON object, got {type(body).__name__}")
  for k in body:
    if k not in allowed:
      raise OpenAIError(f"unknown field '{k}' for {route}", k)
  for k, default in (("presence_penalty", 0), ("frequency_penalty", 0)):
    if body.get(k) not in (None, default, 0.0):
      raise OpenAIError(f"'{k}' is not supported by this server (only {default})", k)
  if body.get("logit_bias"):
    raise OpenAIError("'logit_bias' is not supported by this server", "logit_bias")


def _model(body: Any, served: str) -> str:
  model = body.get("model")
  if model is None:
    raise OpenAIError("'model' is required", "model")
  if model != served:
    raise OpenAIError(f"The model '{model}' does not exist (this server serves '{served}')",
                      "model", status=404, code="model_not_found")
  return model


def _sampling(body: Any, max_tokens: int, vocab_size: int) -> tuple[SamplingParams, int]:
  temperature = float(_num(body, "temperature", 1.0, 0.0, 2.0))
  top_p = float(_num(body, "top_p", 1.0, 0.0, 1.0))
  if top_p <= 0.0:
    raise OpenAIError(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
  top_k = _int(body, "top_k", -1)
  if top_k < 1 and top_k != -1:
    raise OpenAIError(f"'top_k' must be -1 (off) or at least 1, got {top_k}", "top_k")
  n = _int(body, "n", 1, lo=1)
  if n > 128:
    raise OpenAIError(f"'n' must be at most 128, got {n}", "n")
  stop = body.get("stop") or ()
  if isinstance(stop, str):
    stop = (stop,)
  if (not isinstance(stop, (list, tuple)) or len(stop) > 4
      or not all(isinstance(s, str) and s for s in stop)):
    raise OpenAIError(f"'stop' must be a non-empty string or a list of up to 4, got {stop!r}",
                      "stop")
  seed = _int(body, "seed", None)
  return SamplingParams(
      max_new_tokens=max_tokens, temperature=0.0 if temperature < 1e-6 else temperature,
      top_p=top_p, top_k=0 if top_k == -1 or top_k >= vocab_size else top_k, stop=tuple(stop),
      ignore_eos=bool(body.get("ignore_eos")), seed=seed), n


def _stream(body: Any) -> tuple[bool, bool]:
  stream = body.get("stream")
  if stream not in (None, True, False):
    raise OpenAIError(f"'stream' must be a boolean, got {stream!r}", "stream")
  opts = body.get("stream_options") or {}
  if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
    raise OpenAIError(f"'stream_options' must be {{'include_usage': bool}}, got {opts!r}",
                      "stream_options")
  if opts and not stream:
    raise OpenAIError("'stream_options' is only allowed with stream=true", "stream_options")
  return bool(stream), bool(opts.get("include_usage"))


def _prompts(prompt: Any, tokenizer: Any, vocab_size: int) -> list[list[int]]:
  if isinstance(prompt, str):
    return [list(tokenizer.encode(prompt))]
  if isinstance(prompt, list) and prompt:
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
      out = [list(prompt)]
    elif all(isinstance(p, str) for p in prompt):
      out = [list(tokenizer.encode(p)) for p in prompt]
    elif all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                                for t in p) for p in prompt):
      out = [list(p) for p in prompt]
    else:
      raise OpenAIError("'prompt' must be a string, a list of strings, a list of token ids "
                        "or a list of non-empty token-id lists", "prompt")
    for i, p in enumerate(out):
      bad = [t for t in p if not 0 <= t < vocab_size]
      if bad:
        raise OpenAIError(f"prompt {i} has token ids {bad[:5]} outside the vocabulary "
                          f"[0, {vocab_size})", "prompt")
    return out
  raise OpenAIError("'prompt' is required: a string, a list of strings, token ids or lists "
                    "of token ids", "prompt")


def _job(ids: list[int], sampling: SamplingParams, n: int, rid: str, max_context: int,
         param: str) -> PromptJob:
  if not ids:
    raise OpenAIError("a prompt is empty (no tokens)", param)
  if len(ids) + sampling.max_new_tokens > max_context:
    raise OpenAIError(f"This model's maximum context length is {max_context} tokens; the "
                      f"prompt has {len(ids)} and max_tokens asks for "
                      f"{sampling.max_new_tokens} more", param)
  return PromptJob(request=GenerateRequest(prompt_ids=tuple(ids), n=n, sampling=sampling,
                                           request_id=rid), rid=rid)


def parse_completion(body: Any, tokenizer: Any, *, served_model: str, vocab_size: int,
                     max_context: int, rid: str) -> OpenAIRequest:
  """A /v1/completions body -> OpenAIRequest (OpenAIError naming the field)."""
  _check_fields(body, _COMPLETION, "/v1/completions")
  model = _model(body, served_model)
  if body.get("suffix"):
    raise OpenAIError("'suffix' is not supported by this server", "suffix")
  echo = body.get("echo") or False
  if not isinstance(echo, bool):
    raise OpenAIError(f"'echo' must be a boolean, got {echo!r}", "echo")
  max_tokens = _int(body, "max_tokens", 16, lo=0)
  if max_tokens == 0 and not echo:
    raise OpenAIError("'max_tokens' must be at least 1 (0 only with echo=true, to score the "
                      "prompt)", "max_tokens")
  lp = _int(body, "logprobs", None, lo=0)
  if lp is not None and lp > MAX_TOP_LOGPROBS:
    raise OpenAIError(f"'logprobs' must be at most {MAX_TOP_LOGPROBS}, got {lp}", "logprobs")
  sampling, n = _sampling(body, max_tokens, vocab_size)
  best_of = _int(body, "best_of", None, lo=1)
  if best_of is not None and best_of != n:
    raise OpenAIError("'best_of' other than n is not supported by this server", "best_of")
  stream, usage = _stream(body)
  if stream and echo:
    raise OpenAIError("echo with stream=true is not supported by this server", "echo")
  jobs = [_job(ids, sampling, n, f"{rid}-{i}", max_context, "prompt")
          for i, ids in enumerate(_prompts(body.get("prompt"), tokenizer, vocab_size))]
  return OpenAIRequest("completion", model, jobs, lp, echo=echo, stream=stream,
                       include_usage=usage)


def parse_messages(messages: Any) -> list[dict[str, Any]]:
  if not isinstance(messages, list) or not messages:
    raise OpenAIError("'messages' must be a non-empty list of {role, content} objects",
                      "messages")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool",
                                                         "developer"):
      raise OpenAIError(f"messages[{i}] must be an object with a role among system, user, "
                        f"assistant, tool, got {m!r}", f"messages[{i}]")
    content = m.get("content")
    if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
      if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                 for p in content):
        raise OpenAIError(f"messages[{i}].content: only text parts are supported",
                          f"messages[{i}].content")
      content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
      raise OpenAIError(f"messages[{i}].content must be a string, got {content!r}",
                        f"messages[{i}].content")
    out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
  return out


def parse_chat(body: Any, tokenizer: Any, *, served_model: str, vocab_size: int,
               max_context: int, rid: str) -> OpenAIRequest:
  """A /v1/chat/completions body -> OpenAIRequest (OpenAIError naming the field)."""
  _check_fields(body, _CHAT, "/v1/chat/completions")
  model = _model(body, served_model)
  for k in ("tools", "tool_choice", "response_format", "parallel_tool_calls"):
    if body.get(k) not in (None, [], "none", {"type": "text"}, False):
      raise OpenAIError(f"'{k}' is not supported by this server", k)
  if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
    raise OpenAIError("give one of 'max_tokens' and 'max_completion_tokens'",
                      "max_completion_tokens")
  key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
  messages = parse_messages(body.get("messages"))
  try:
    ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True))
  except Exception as e:  # noqa: BLE001 -- a template that refuses these messages
    raise OpenAIError(f"the chat template cannot render these messages: {e}", "messages") from e
  remaining = max(1, max_context - len(ids))
  max_tokens = _int(body, key, remaining, lo=1)
  logprobs = body.get("logprobs")
  if logprobs not in (None, True, False):
    raise OpenAIError(f"'logprobs' must be a boolean, got {logprobs!r}", "logprobs")
  top = _int(body, "top_logprobs", None, lo=0)
  if top is not None and not logprobs:
    raise OpenAIError("'top_logprobs' needs logprobs=true", "top_logprobs")
  if top is not None and top > MAX_TOP_LOGPROBS:
    raise OpenAIError(f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}, got {top}",
                      "top_logprobs")
  sampling, n = _sampling(body, max_tokens, vocab_size)
  stream, usage = _stream(body)
  job = _job(ids, sampling, n, f"{rid}-0", max_context, "messages")
  return OpenAIRequest("chat", model, [job], (top or 0) if logprobs else None, stream=stream,
                       include_usage=usage)


# --- answers -------------------------------------------------------------------------


@dataclasses.dataclass
class Scored:
  """One completion's scoring forward over prompt + completion: per position j >= 1,
  log p(seq[j] | seq[:j]) and the top-k alternatives (ids, logprobs), k >= 1."""
  chosen: Sequence[float]
  top_ids: Sequence[Sequence[int]]
  top_lps: Sequence[Sequence[float]]


def _tok(tokenizer, t: int) -> str:
  return tokenizer.decode([int(t)])


def _completion_logprobs(tokenizer, ids: Sequence[int], first: int, sc: Scored, k: int,
                         text_start: int) -> dict[str, Any]:
  """OpenAI's legacy logprobs object over seq[first:] (position 0 has no logprob)."""
  tokens, lps, tops, offsets = [], [], [], []
  at = text_start
  for j in range(first, len(ids)):
    s = _tok(tokenizer, ids[j])
    tokens.append(s)
    offsets.append(at)
    at += len(s)
    if j == 0:
      lps.append(None)
      tops.append(None)
      continue
    lps.append(float(sc.chosen[j]))
    top: dict[str, float] = {}
    for t, v in zip(sc.top_ids[j][:k], sc.top_lps[j][:k]):
      top.setdefault(_tok(tokenizer, t), float(v))
    top.setdefault(s, float(sc.chosen[j]))   # OpenAI lists the chosen token too
    tops.append(top)
  return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
          "text_offset": offsets}


def _chat_logprobs(tokenizer, ids: Sequence[int], first: int, sc: Scored, k: int) -> dict:
  def entry(t, v):
    s = _tok(tokenizer, t)
    return {"token": s, "logprob": float(v), "bytes": list(s.encode("utf-8"))}
  content = []
  for j in range(first, len(ids)):
    e = entry(ids[j], sc.chosen[j])
    e["top_logprobs"] = [entry(t, v) for t, v in zip(sc.top_ids[j][:k], sc.top_lps[j][:k])]
    content.append(e)
  return {"content": content}


def _finish(c: Completion) -> str:
  return "length" if c.finish_reason in CUT_AT_BUDGET else "stop"


def answer(req: OpenAIRequest, results: Sequence[Sequence[Completion]],
           scored: dict[tuple[int, int], Scored], tokenizer: Any, rid: str) -> dict[str, Any]:
  """The non-streaming response body. results[i]: job i's n completions; scored[(i, j)]:
  the scoring forward of job i's completion j (when logprobs were asked for)."""
  choices, prompt_tokens, completion_tokens = [], 0, 0
  for i, (job, comps) in enumerate(zip(req.jobs, results)):
    prompt = list(job.request.prompt_ids)
    prompt_tokens += len(prompt)
    for j, c in enumerate(comps):
      completion_tokens += len(c.token_ids)
      seq = prompt + list(c.token_ids)
      choice: dict[str, Any] = {"index": i * len(comps) + j, "finish_reason": _finish(c)}
      if req.kind == "completion":
        prefix = tokenizer.decode(prompt) if req.echo else ""
        choice["text"] = prefix + c.text
        choice["logprobs"] = None
        if req.logprobs is not None:
          first = 0 if req.echo else len(prompt)
          choice["logprobs"] = _completion_logprobs(tokenizer, seq, first, scored[(i, j)],
                                                    req.logprobs, 0)
      else:
        choice["message"] = {"role": "assistant", "content": c.text}
        choice["logprobs"] = None
        if req.logprobs is not None:
          choice["logprobs"] = _chat_logprobs(tokenizer, seq, len(prompt), scored[(i, j)],
                                              req.logprobs)
      choice.update(token_ids=list(c.token_ids), prompt_token_ids=prompt,
                    weight_version=str(c.weight_version))
      choices.append(choice)
  return {"id": rid, "object": "text_completion" if req.kind == "completion" else "chat.completion",
          "created": int(time.time()), "model": req.model, "choices": choices,
          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}}
