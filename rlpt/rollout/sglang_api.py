"""SGLang's native /generate JSON, parsed into rlpt requests and built from completions.

Request body (SGLang 0.5.x, `GenerateReqInput`): exactly one of `text` (str or
list of str) and `input_ids` (list of int or list of lists); `sampling_params`
(one dict, or one per prompt); `rid`; `return_logprob`; `logprob_start_len`
(-1 = output logprobs only); `return_text_in_logprobs`; `return_prompt_token_ids`.
`sampling_params.n` > 1 expands a prompt into n samples. A single prompt with
n == 1 answers one object; anything else answers a list, prompt-major
(prompt i, sample j at index i * n + j).

Each answer object: {"text", "output_ids", "meta_info": {"id", "finish_reason",
"prompt_tokens", "completion_tokens", "cached_tokens", "weight_version",
"e2e_latency", ["input_token_logprobs", "output_token_logprobs"],
["output_token_weight_versions"]}} where a logprob
entry is [logprob, token_id, token_text or None]. Input logprobs cover prompt
positions logprob_start_len .. P-1; the entry of position j is
log p(prompt[j] | prompt[:j]) (None for j = 0, which nothing predicts).
`output_token_weight_versions` (an rlpt extension) is present when a sample's tokens
came from several weight versions (a partial rollout continued under new weights,
`/update_weights_from_disk` with `continue_requests`): the version of each output
token; `weight_version` is then the first token's.

Settings this server cannot honour (grammars, penalties, min_p, streaming, ...)
are refused with `ApiError` rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from rlpt.rollout.engine import Completion, GenerateRequest, SamplingParams

TOP_K_ALL = 1 << 30

# sampling_params keys: accepted and used / accepted only at their default value.
_USED = {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids",
         "ignore_eos", "n", "sampling_seed", "max_wall_s"}
# "max_wall_s" is rlpt's own (SamplingParams.max_wall_s; SGLang has no such key): a
# sample that decodes longer ends with its tokens, answered as finish_reason
# {"type": "length", "length": N, "cap": "max_wall_s"}.
_DEFAULT_ONLY = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                 "repetition_penalty": 1.0, "min_new_tokens": 0, "json_schema": None,
                 "regex": None, "ebnf": None, "structural_tag": None, "stop_regex": None,
                 "logit_bias": None, "no_stop_trim": False, "beam_width": None, "watermark": None}
_IGNORED = {"skip_special_tokens", "spaces_between_special_tokens", "stream_interval",
            "custom_params"}

# Top-level /generate keys: used / harmless when null or false.
_TOP_USED = {"text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
             "return_text_in_logprobs", "return_prompt_token_ids", "top_logprobs_num", "stream",
             "log_metrics", "session_id"}


class ApiError(ValueError):
  """A request SGLang would refuse; `status` is the HTTP code (400)."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass
class PromptJob:
  """One prompt of a /generate call: the engine request and how to answer it.

  Attributes:
    request: the engine request (prompt as token ids, n samples).
    rid: the request id answered in meta_info.id.
    return_logprob: answer input/output token logprobs.
    logprob_start_len: first prompt position with an input logprob (-1 = none).
    return_text_in_logprobs: put each token's text into the logprob entries.
    return_prompt_token_ids: add "prompt_token_ids" to each answer.
  """

  request: GenerateRequest
  rid: str
  return_logprob: bool = False
  logprob_start_len: int = -1
  return_text_in_logprobs: bool = False
  return_prompt_token_ids: bool = False

  @property
  def prompt_ids(self) -> list[int]:
    return list(self.request.prompt_ids)

  @property
  def wants_input_logprobs(self) -> bool:
    return self.return_logprob and self.logprob_start_len >= 0

  @property
  def score_only(self) -> bool:
    return self.request.sampling.max_new_tokens == 0


def _per_prompt(value: Any, batch: int, name: str, single: bool) -> list[Any]:
  if isinstance(value, list) and not single:
    if len(value) != batch:
      raise ApiError(f"{name} has {len(value)} entries for a batch of {batch} prompts")
    return value
  return [value] * batch


def _number(sp: dict, key: str, default: float, where: str) -> float:
  v = sp.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise ApiError(f"{where}.{key} must be a number, got {v!r}")
  return float(v)


def _int(sp: dict, key: str, default: int | None, where: str) -> int | None:
  v = sp.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, int):
    raise ApiError(f"{where}.{key} must be an integer, got {v!r}")
  return v


def parse_sampling(sp: Any, where: str, vocab_size: int,
                   default_max_new_tokens: int) -> tuple[SamplingParams, int]:
  """SGLang's sampling_params dict -> (SamplingParams, n); ApiError on bad values."""
  if sp is None:
    sp = {}
  if not isinstance(sp, dict):
    raise ApiError(f"{where} must be an object, got {type(sp).__name__}")
  for k, v in sp.items():
    if k in _USED or k in _IGNORED:
      continue
    if k in _DEFAULT_ONLY:
      if v is not None and v != _DEFAULT_ONLY[k] and v not in ("", [], {}):
        raise ApiError(f"{where}.{k}={v!r} is not supported by this server "
                       f"(only the default {_DEFAULT_ONLY[k]!r})")
      continue
    raise ApiError(f"{where}: unknown sampling parameter '{k}'")
  max_new = _int(sp, "max_new_tokens", default_max_new_tokens, where)
  if max_new < 0:
    raise ApiError(f"max_new_tokens must be at least 0, got {max_new}.")
  temperature = _number(sp, "temperature", 1.0, where)
  if not math.isfinite(temperature) or temperature < 0:
    raise ApiError(f"temperature must be a non-negative finite number, got {temperature}.")
  top_p = _number(sp, "top_p", 1.0, where)
  if not 0.0 < top_p <= 1.0:
    raise ApiError(f"top_p must be in (0, 1], got {top_p}.")
  top_k = _int(sp, "top_k", -1, where)
  if top_k < 1 and top_k != -1:
    raise ApiError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
  top_k = 0 if top_k == -1 or top_k >= vocab_size else top_k
  if temperature < 1e-6:  # SGLang's rule: (near) zero temperature is greedy
    temperature = 0.0
  stop = sp.get("stop") or ()
  if isinstance(stop, str):
    stop = (stop,)
  if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
    raise ApiError(f"{where}.stop must be a non-empty string or a list of them, got {stop!r}")
  stop_ids = sp.get("stop_token_ids") or ()
  if not isinstance(stop_ids, (list, tuple)) or not all(
      isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
    raise ApiError(f"{where}.stop_token_ids must be a list of integers, got {stop_ids!r}")
  bad = [t for t in stop_ids if not 0 <= t < vocab_size]
  if bad:
    raise ApiError(f"{where}.stop_token_ids: {bad} outside the vocabulary [0, {vocab_size})")
  n = _int(sp, "n", 1, where)
  if n < 1:
    raise ApiError(f"{where}.n must be >= 1, got {n}")
  seed = _int(sp, "sampling_seed", None, where)
  max_wall_s = _number(sp, "max_wall_s", None, where)
  if max_wall_s is not None and not (math.isfinite(max_wall_s) and max_wall_s > 0):
    raise ApiError(f"{where}.max_wall_s must be a positive number of seconds, got {max_wall_s}")
  ignore_eos = sp.get("ignore_eos")
  params = SamplingParams(max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                          top_k=top_k, stop=tuple(stop), stop_token_ids=tuple(stop_ids),
                          ignore_eos=bool(ignore_eos), seed=seed, max_wall_s=max_wall_s)
  return params, n


def parse_generate(body: Any, tokenizer: Any, *, vocab_size: int, max_context: int,
                   default_max_new_tokens: int = 128,
                   rid_prefix: str = "rlpt") -> tuple[list[PromptJob], bool]:
  """A /generate body -> (one PromptJob per prompt, answer-as-single-object).

  Raises:
    ApiError: naming the field and what was expected.
  """
  if not isinstance(body, dict):
    raise ApiError(f"the /generate body must be a JSON object, got {type(body).__name__}")
  for k, v in body.items():
    if k not in _TOP_USED and v not in (None, False, [], {}):
      raise ApiError(f"field '{k}' is not supported by this server")
  if body.get("stream"):
    raise ApiError("stream=true is not supported by this server; send stream=false")
  if body.get("top_logprobs_num"):
    raise ApiError("top_logprobs_num is not supported by this server")
  text, ids = body.get("text"), body.get("input_ids")
  if (text is None) == (ids is None):
    raise ApiError("Either text or input_ids should be provided (exactly one of them).")
  if text is not None:
    single = isinstance(text, str)
    texts = [text] if single else text
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
      raise ApiError("text must be a string or a list of strings")
    prompts = [list(tokenizer.encode(t)) for t in texts]
  else:
    if not isinstance(ids, list) or not ids:
      raise ApiError("input_ids must be a non-empty list of token ids or of lists of them")
    single = all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
    prompts = [ids] if single else ids
    for i, p in enumerate(prompts):
      if not isinstance(p, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in p):
        raise ApiError(f"input_ids[{i}] must be a list of integers")
      bad = [t for t in p if not 0 <= t < vocab_size]
      if bad:
        raise ApiError(f"input_ids[{i}] has token ids {bad[:5]} outside the vocabulary "
                       f"[0, {vocab_size})")
  if not prompts:
    raise ApiError("the batch is empty")
  batch = len(prompts)
  sps = _per_prompt(body.get("sampling_params"), batch, "sampling_params", single)
  rids = body.get("rid")
  if rids is None:
    rids = [f"{rid_prefix}-{i}" for i in range(batch)]
  elif isinstance(rids, str):
    rids = [rids] if single else [f"{rids}_{i}" for i in range(batch)]
  elif not isinstance(rids, list) or len(rids) != batch:
    raise ApiError(f"rid must be a string or a list of {batch} strings")
  ret_lp = _per_prompt(body.get("return_logprob"), batch, "return_logprob", single)
  starts = _per_prompt(body.get("logprob_start_len"), batch, "logprob_start_len", single)
  jobs = []
  for i, p in enumerate(prompts):
    where = "sampling_params" if single else f"sampling_params[{i}]"
    sampling, n = parse_sampling(sps[i], where, vocab_size, default_max_new_tokens)
    if not p:
      raise ApiError(f"prompt {i} is empty (no tokens)")
    if len(p) + sampling.max_new_tokens > max_context:
      raise ApiError(
          f"The input ({len(p)} tokens) plus max_new_tokens ({sampling.max_new_tokens}) is "
          f"longer than the model's context length ({max_context} tokens).")
    start = starts[i]
    start = -1 if start is None else start
    if isinstance(start, bool) or not isinstance(start, int):
      raise ApiError(f"logprob_start_len must be an integer, got {start!r}")
    if start >= len(p):
      raise ApiError(f"logprob_start_len ({start}) is not smaller than the prompt length "
                     f"({len(p)} tokens)")
    jobs.append(PromptJob(
        request=GenerateRequest(prompt_ids=tuple(p), n=n, sampling=sampling,
                                request_id=str(rids[i])),
        rid=str(rids[i]), return_logprob=bool(ret_lp[i]), logprob_start_len=start,
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs")),
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids"))))
  return jobs, single and jobs[0].request.n == 1


def _entries(values: Sequence[float | None], ids: Sequence[int], tokenizer: Any,
             with_text: bool) -> list[list[Any]]:
  return [[None if v is None else float(v), int(t),
           tokenizer.decode([int(t)]) if with_text else None] for v, t in zip(values, ids)]


def finish_reason(comp: Completion, stops: Sequence[str]) -> dict[str, Any]:
  """SGLang's finish_reason object for a completion."""
  if comp.finish_reason == "length":
    return {"type": "length", "length": len(comp.token_ids)}
  if comp.finish_reason == "time":
    return {"type": "length", "length": len(comp.token_ids), "cap": "max_wall_s"}
  if comp.finish_reason == "abort":
    return {"type": "abort", "message": "aborted"}
  matched: Any = None
  if comp.token_ids and not any(s in comp.text for s in stops):
    matched = comp.token_ids[-1]
  return {"type": "stop", "matched": matched}


def answer(job: PromptJob, comps: Sequence[Completion], tokenizer: Any,
           input_logprobs: Sequence[float] | None, latency_s: float) -> list[dict[str, Any]]:
  """The n answer objects of one prompt.

  Args:
    job: the prompt's job.
    comps: its n completions (empty-output completions for score-only jobs).
    input_logprobs: per prompt position j, log p(prompt[j] | prompt[:j]) ([P];
      entry 0 unused), when the job asked for input logprobs.
  """
  prompt = job.prompt_ids
  out = []
  for j, c in enumerate(comps):
    meta: dict[str, Any] = {
        "id": job.rid if len(comps) == 1 else f"{job.rid}_{j}",
        "finish_reason": finish_reason(c, job.request.sampling.stop),
        "prompt_tokens": len(prompt),
        "completion_tokens": len(c.token_ids),
        "cached_tokens": 0,
        "weight_version": str(c.weight_version),
        "e2e_latency": latency_s,
    }
    if c.token_versions is not None:  # rlpt extension: a partial rollout's per-token versions
      meta["output_token_weight_versions"] = list(c.token_versions)
    if job.return_logprob:
      if job.wants_input_logprobs and input_logprobs is not None:
        s = job.logprob_start_len
        vals = [None if k == 0 else input_logprobs[k] for k in range(s, len(prompt))]
        meta["input_token_logprobs"] = _entries(vals, prompt[s:], tokenizer,
                                                job.return_text_in_logprobs)
      else:
        meta["input_token_logprobs"] = []
      meta["output_token_logprobs"] = _entries(c.logprobs, c.token_ids, tokenizer,
                                               job.return_text_in_logprobs)
      meta["output_token_sampling_logprobs"] = [float(x) for x in c.sampling_logprobs]
    obj: dict[str, Any] = {"text": c.text, "output_ids": list(c.token_ids), "meta_info": meta}
    if job.return_prompt_token_ids:
      obj["prompt_token_ids"] = list(prompt)
    out.append(obj)
  return out


def error_body(message: str) -> dict[str, Any]:
  """The body SGLang's /generate answers a refused request with (HTTP 400)."""
  return {"error": {"message": message}}


def validation_error_body(message: str, status: int = 400) -> dict[str, Any]:
  """The body SGLang answers when the JSON itself does not parse or validate."""
  return {"object": "error", "message": message, "type": "Bad Request", "param": None,
          "code": status}
