"""Host-side request handling for JaxEngine: prompts to token ids, stop strings,
detokenised completions.

Everything here is plain Python over token ids; the device never sees text.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from rlpt.rollout.engine import GenerateRequest, SamplingParams


def prompt_ids(request: GenerateRequest, tokenizer: Any, index: int) -> list[int]:
  """The request's prompt as token ids: given ids, the chat template rendered with
  its generation prompt, or the encoded text. Raises ValueError on an empty prompt."""
  if request.prompt_ids is not None:
    ids = [int(t) for t in request.prompt_ids]
  elif request.messages is not None:
    for m in request.messages:
      if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ValueError(f"request {index}: every message needs 'role' and 'content', got {m!r}")
    text = tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True)
    ids = list(tokenizer.encode(text))
  else:
    ids = list(tokenizer.encode(request.text))
  if not ids:
    raise ValueError(f"request {index}: the prompt is empty (no tokens)")
  return ids


def check_sampling(sp: SamplingParams, index: int, vocab_size: int) -> None:
  """Rejects settings the sampler cannot honour, naming the request and field."""
  where = f"request {index}: SamplingParams"
  if sp.max_new_tokens < 1:
    raise ValueError(f"{where}.max_new_tokens must be >= 1, got {sp.max_new_tokens}")
  if not sp.temperature >= 0:
    raise ValueError(f"{where}.temperature must be >= 0, got {sp.temperature}")
  if not 0 < sp.top_p <= 1:
    raise ValueError(f"{where}.top_p must be in (0, 1], got {sp.top_p}")
  if sp.top_k < 0:
    raise ValueError(f"{where}.top_k must be >= 0, got {sp.top_k}")
  for t in sp.stop_token_ids:
    if not 0 <= t < vocab_size:
      raise ValueError(f"{where}.stop_token_ids: {t} is outside the vocabulary [0, {vocab_size})")
  if any(not s for s in sp.stop):
    raise ValueError(f"{where}.stop: stop strings must be non-empty")


def stop_token_set(sp: SamplingParams, eos_ids: Sequence[int]) -> tuple[int, ...]:
  """Token ids that end a sample: the request's stop ids, plus EOS unless ignore_eos."""
  ids = list(sp.stop_token_ids)
  if not sp.ignore_eos:
    ids += [e for e in eos_ids if e not in ids]
  return tuple(ids)


@dataclasses.dataclass
class Finished:
  """A sample's final tokens and text after stop handling."""

  token_ids: list[int]
  text: str
  logprobs: list[float]
  sampling_logprobs: list[float]
  stopped: bool  # ended by a stop string or stop token


def find_stop_string(text: str, stops: Sequence[str]) -> int:
  """Index of the earliest occurrence of any stop string in text, or -1."""
  hits = [i for i in (text.find(s) for s in stops) if i >= 0]
  return min(hits) if hits else -1


def finish_sample(tokenizer: Any, tokens: list[int], logp: list[float], logq: list[float],
                  stop_token_hit: bool, stops: Sequence[str]) -> Finished:
  """Applies stop strings to a sample and detokenises it.

  `tokens` may end with the stop token that ended it (`stop_token_hit`): it stays
  in token_ids (the learner trains on it) but not in the text. With stop strings,
  the text ends before the first occurrence, and the tokens are cut after the
  first token whose text completes that occurrence.
  """
  body = tokens[:-1] if stop_token_hit else tokens
  text = tokenizer.decode(body)
  if stops:
    at = find_stop_string(text, stops)
    if at >= 0:
      # Shortest prefix of tokens whose text already contains the stop string.
      cut = len(body)
      for k in range(1, len(body) + 1):
        if find_stop_string(tokenizer.decode(body[:k]), stops) >= 0:
          cut = k
          break
      return Finished(list(body[:cut]), text[:at], list(logp[:cut]), list(logq[:cut]), True)
  return Finished(list(tokens), text, list(logp), list(logq), stop_token_hit)
