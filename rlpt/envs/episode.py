"""Token-exact multi-turn episodes: an environment driving a RolloutEngine.

An episode's tokens are its opening prompt, then turn by turn the token ids the
engine sampled (trained: mask True, with their logprobs) and the environment's
answer as token ids rendered by the chat template (masked out: mask False,
logprob 0). The model's turns are never decoded and re-encoded: what the learner
scores are the sampled ids (decoding then re-encoding can change them: "multi-
turn token drift", tests/envs/test_episode.py shows it for SmolLM2's tokenizer).

How an environment turn becomes ids (`Renderer.env_ids`): render the history up
to this assistant turn with the generation prompt (text A), then the history with
the assistant turn and the new messages (text B). When B starts with A plus the
turn's text, the ids are the encoding of the rest of B, minus the stop token the
model already sampled (SmolLM2's `<|im_end|>`). When it does not, the template
rewrote an earlier turn (Qwen3's drops earlier `<think>` blocks); the rule is
then to keep extending the sampled ids, never to re-render them: the new messages
are rendered as the template renders them after a plain assistant turn, and the
episode counts a `template_rewrites` (the environment turns at which the template
changed how it renders an earlier turn). A template that cannot render a tool turn
after an assistant turn at all is refused up front (`check_template`).

Caps (`EpisodeCaps`): model turns, context tokens, tool seconds. No episode holds
more than max_context_tokens: an environment answer that would leave the model no
room to reply ends the episode before it is appended. An episode that
hits a cap is `truncated` (the cap's name), its last rollout finish_reason is
"length", and its reward is 0 (`truncated_reward="zero"`) or the verifier's
verdict on the final state, left to the RL step's overlong shaping ("score").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Sequence

from rlpt.envs import tool_calls
from rlpt.envs.base import Environment, ToolRecord
from rlpt.rewards import registry
from rlpt.rollout.engine import GenerateRequest, RolloutEngine, SamplingParams
from rlpt.rollout.jax_engine import turn_seed
from rlpt.types import RewardResult, Rollout, Task

TRUNCATED_REWARDS = ("zero", "score")


@dataclasses.dataclass(frozen=True)
class EpisodeCaps:
  """Per-episode limits (see the module docstring)."""
  max_turns: int = 8
  max_context_tokens: int = 2048
  max_tool_s: float = 60.0
  truncated_reward: str = "zero"

  def __post_init__(self):
    for f in ("max_turns", "max_context_tokens", "max_tool_s"):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f"EpisodeCaps.{f} must be a positive number, got {v!r}")
    if self.truncated_reward not in TRUNCATED_REWARDS:
      raise ValueError(f"EpisodeCaps.truncated_reward must be one of {TRUNCATED_REWARDS}, "
                       f"got {self.truncated_reward!r}")


@dataclasses.dataclass
class Turn:
  """One assistant turn and the environment's answer, as the trajectory keeps it.

  span: [start, end) of the turn's model tokens in Episode.ids.
  env_tokens: ids the environment's answer added after it (masked).
  """
  text: str
  span: tuple[int, int]
  finish_reason: str
  records: tuple[ToolRecord, ...] = ()
  env_messages: tuple[dict[str, str], ...] = ()
  env_tokens: int = 0

  def record(self) -> dict[str, Any]:
    """This turn as plain JSON data (Rollout.turns, the trajectory store)."""
    return {"text": self.text, "span": list(self.span), "finish_reason": self.finish_reason,
            "tools": [dataclasses.asdict(r) for r in self.records],
            "env_messages": [dict(m) for m in self.env_messages], "env_tokens": self.env_tokens}


@dataclasses.dataclass
class Episode:
  """One task's episode: prompt ids, then model and environment ids interleaved.

  ids / mask / logprobs: aligned, [C]; mask True on sampled (trained) tokens.
  weight_versions: per model turn, the weight version that sampled it.
  truncated: the cap that ended it ("max_turns" | "max_context" | "tool_time"), or None.
  """
  task: Task
  prompt_ids: list[int]
  messages: list[dict[str, str]]
  ids: list[int] = dataclasses.field(default_factory=list)
  mask: list[bool] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  turns: list[Turn] = dataclasses.field(default_factory=list)
  weight_versions: list[int] = dataclasses.field(default_factory=list)
  truncated: str | None = None
  done: bool = False
  template_rewrites: int = 0
  completion: str = ""
  reward: RewardResult | None = None
  seed: int | None = None       # the episode's sampling seed (turn k draws turn_seed(seed, k))
  closed: bool = False          # its final state was read and its environment closed

  @property
  def context_len(self) -> int:
    return len(self.prompt_ids) + len(self.ids)

  @property
  def violations(self) -> tuple[str, ...]:
    return tuple(r.violation for t in self.turns for r in t.records if r.violation)

  def to_rollout(self, group_id: int = 0, tokenizer: Any = None) -> Rollout:
    """The learner's view: every id after the prompt is a completion id, the
    environment's masked out (Rollout.completion_mask)."""
    text = tokenizer.decode(self.ids) if tokenizer is not None else ""
    turns = [t.record() for t in self.turns]
    if self.truncated and turns:
      turns[-1]["truncated"] = self.truncated
    return Rollout(task=self.task, prompt_ids=list(self.prompt_ids), completion_ids=list(self.ids),
                   completion_text=text, logprobs=list(self.logprobs),
                   weight_version=min(self.weight_versions, default=0),
                   finish_reason="length" if self.truncated else "stop", group_id=group_id,
                   reward=self.reward, completion_mask=list(self.mask), turns=turns,
                   verified_text=self.completion)


class Renderer:
  """Opening prompts and environment turns as token ids (module docstring)."""

  NEUTRAL = ({"role": "user", "content": "?"},)

  def __init__(self, tokenizer: Any):
    self.tokenizer = tokenizer
    self.tool_role = tool_calls.template_has_tool_role(getattr(tokenizer, "chat_template", None))

  def opening(self, messages: Sequence[dict[str, str]]) -> list[int]:
    return list(self.tokenizer.encode(self.tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True)))

  def result(self, name: str, content: str) -> dict[str, str]:
    return tool_calls.result_message(name, content, tool_role=self.tool_role)

  def adapt(self, messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Environments answer with {"role": "tool", "name", "content"}; a template
    without a tool role gets the documented fallback (tool_calls.result_message)."""
    return [self.result(m.get("name", ""), m["content"]) if m.get("role") == "tool" else dict(m)
            for m in messages]

  def env_ids(self, history: Sequence[dict[str, str]], turn_text: str, stop_text: str,
              new: Sequence[dict[str, str]]) -> tuple[list[int], bool]:
    """(ids of `new` after the sampled turn, whether the template rewrote history)."""
    rest = self._rest(history, turn_text, new)
    rewritten = rest is None
    if rewritten:
      rest = self._rest(self.NEUTRAL, "!", new)
      if rest is None:
        raise ValueError("the chat template does not render messages after an assistant turn "
                         "as an extension of the conversation")
    if stop_text and rest.startswith(stop_text):
      rest = rest[len(stop_text):]
    return list(self.tokenizer.encode(rest, add_special_tokens=False)), rewritten

  def _rest(self, history, turn_text, new) -> str | None:
    t = self.tokenizer
    before = t.apply_chat_template(list(history), add_generation_prompt=True) + turn_text
    after = t.apply_chat_template(list(history) + [{"role": "assistant", "content": turn_text}]
                                  + list(new), add_generation_prompt=True)
    return after[len(before):] if after.startswith(before) else None


def check_template(tokenizer: Any) -> None:
  """Raises ValueError (naming what failed) unless the tokenizer's chat template
  renders a tool result after an assistant turn as an extension of the
  conversation: the config check that runs before any model loads."""
  r = Renderer(tokenizer)
  if getattr(tokenizer, "chat_template", None) is None:
    raise ValueError("multi-turn episodes need a chat template; the tokenizer has none")
  try:
    ids, _ = r.env_ids(r.NEUTRAL, "!", "", [r.result("python", "42")])
  except Exception as e:  # noqa: BLE001 -- a template error is the config error
    raise ValueError(f"the chat template cannot render a tool turn: {e}") from e
  if "42" not in tokenizer.decode(ids):
    raise ValueError("the chat template drops the content of a tool turn")


def run_episodes(engine: RolloutEngine, renderer: Renderer, envs: Sequence[Environment],
                 tasks: Sequence[Task], *, sampling: SamplingParams, caps: EpisodeCaps,
                 tempered: bool = False, reward_config: registry.RewardConfig | None = None,
                 kv_reuse: bool | None = None) -> list[Episode]:
  """Runs one episode per (env, task) through `engine`; returns them scored.

  kv_reuse: continue each episode's slot from its KV cache turn after turn
  (JaxEngine.generate(continue_fn=...): environments answer on worker threads while
  other episodes decode); False: every turn is a new request holding the whole
  history (batched turn by turn; any RolloutEngine); None: reuse where the engine
  can. Both give the same tokens for a seeded sampling (each turn draws with
  `turn_seed(seed, turn)`). tempered: train the sampling distribution's logprobs
  (a rollout temperature other than 0 or 1, as rlpt.train.scheduler).
  """
  eps = play_episodes(engine, renderer, envs, tasks, sampling=sampling, caps=caps,
                      tempered=tempered, kv_reuse=kv_reuse)
  results = registry.compute_rewards([e.task for e in eps], [e.completion for e in eps],
                                     config=reward_config)
  for e, r in zip(eps, results):
    e.reward = score(r, e.violations, e.truncated, caps, reward_config)
  return eps


def play_episodes(engine: RolloutEngine, renderer: Renderer, envs: Sequence[Environment],
                  tasks: Sequence[Task], *, sampling: SamplingParams, caps: EpisodeCaps,
                  tempered: bool = False, kv_reuse: bool | None = None,
                  seeds: Sequence[int | None] | None = None) -> list[Episode]:
  """`run_episodes` without the scoring: the episodes with their final state
  (`Episode.completion`) read and every environment closed, `reward` None. The RL
  step verifies them with the rest of its round (rlpt.train.scheduler) and prices
  the episodes' own violations in with `score_rollout`. Each environment is closed
  (its sandbox session released) as soon as its episode ends. seeds: per episode,
  the sampling seed (default: sampling.seed for all)."""
  if len(envs) != len(tasks):
    raise ValueError(f"play_episodes: {len(envs)} environments for {len(tasks)} tasks")
  if seeds is not None and len(seeds) != len(tasks):
    raise ValueError(f"play_episodes: {len(seeds)} seeds for {len(tasks)} tasks")
  if any(sampling.stop):
    raise ValueError("play_episodes: turns end on the tokenizer's stop token; stop strings "
                     f"are not supported, got {sampling.stop!r}")
  can = getattr(engine, "continues_turns", False)
  if kv_reuse and not can:
    raise ValueError(f"play_episodes: kv_reuse needs an engine that continues turns "
                     f"(JaxEngine); {type(engine).__name__} does not")
  run = _run_continued if (can if kv_reuse is None else kv_reuse) else _run
  seeds = list(seeds) if seeds is not None else [sampling.seed] * len(tasks)
  try:
    eps = run(engine, renderer, envs, tasks, sampling, caps, tempered, seeds)
    for e, env in zip(eps, envs):
      _close(e, env)
  finally:
    for env in envs:
      env.close()
  return eps


def _close(e: Episode, env: Environment) -> None:
  """Reads an ended episode's final state and releases its environment (once)."""
  if not e.closed:
    e.completion = env.completion()
    env.close()
    e.closed = True


def _start(renderer, envs, tasks, seeds) -> list[Episode]:
  eps = []
  for env, task, seed in zip(envs, tasks, seeds):
    msgs = renderer.adapt(env.reset(task))
    eps.append(Episode(task=task, prompt_ids=renderer.opening(msgs), messages=msgs, seed=seed))
  return eps


def _turn_sampling(sampling: SamplingParams, e: Episode, caps: EpisodeCaps) -> SamplingParams:
  seed = None if e.seed is None else turn_seed(e.seed, len(e.turns))
  return dataclasses.replace(sampling, seed=seed, max_new_tokens=min(
      sampling.max_new_tokens, caps.max_context_tokens - e.context_len))


def _run_continued(engine, renderer, envs, tasks, sampling, caps, tempered, seeds
                   ) -> list[Episode]:
  """Every episode one request; each turn continues its slot (JaxEngine continue_fn)."""
  eos = renderer.tokenizer.eos_token_id
  eps = _start(renderer, envs, tasks, seeds)
  live = [i for i, e in enumerate(eps) if e.context_len < caps.max_context_tokens]
  for i in set(range(len(eps))) - set(live):
    eps[i].truncated, eps[i].done = "max_context", True

  def cont(r: int, _sample: int, c: Any):
    i = live[r]
    e, env = eps[i], envs[i]
    st = env.step(c.text)
    before = len(e.ids) + len(c.token_ids)
    _advance(e, env, c, st, renderer, caps, eos, tempered)
    if not e.done and caps.max_context_tokens - e.context_len < 1:
      e.truncated, e.done = "max_context", True
    if e.done:
      _close(e, env)
      return None
    room = caps.max_context_tokens - e.context_len
    return e.ids[before:], min(sampling.max_new_tokens, room)

  if live:
    engine.generate([GenerateRequest(prompt_ids=tuple(eps[i].prompt_ids),
                                     sampling=_turn_sampling(sampling, eps[i], caps))
                     for i in live], continue_fn=cont, context_len=caps.max_context_tokens)
  return eps


def _run(engine, renderer, envs, tasks, sampling, caps, tempered, seeds) -> list[Episode]:
  """Turn by turn: each live episode's whole history is a new request."""
  eos = renderer.tokenizer.eos_token_id
  eps = _start(renderer, envs, tasks, seeds)
  with concurrent.futures.ThreadPoolExecutor(max(1, len(eps))) as pool:
    while True:
      live = [i for i, e in enumerate(eps) if not e.done]
      if not live:
        break
      for i in live:
        if eps[i].context_len >= caps.max_context_tokens:
          eps[i].truncated, eps[i].done = "max_context", True
      live = [i for i in live if not eps[i].done]
      if not live:
        break
      reqs = [GenerateRequest(prompt_ids=tuple(eps[i].prompt_ids + eps[i].ids),
                              sampling=_turn_sampling(sampling, eps[i], caps)) for i in live]
      comps = engine.generate(reqs)
      steps = list(pool.map(lambda ic: envs[ic[0]].step(ic[1].text), zip(live, comps)))
      for i, c, st in zip(live, comps, steps):
        _advance(eps[i], envs[i], c, st, renderer, caps, eos, tempered)
        if eps[i].done:
          _close(eps[i], envs[i])
  return eps


def _advance(e: Episode, env: Environment, c: Any, st: Any, renderer: Renderer,
             caps: EpisodeCaps, eos: int | None, tempered: bool) -> None:
  start = len(e.ids)
  e.ids += list(c.token_ids)
  e.mask += [True] * len(c.token_ids)
  e.logprobs += list(c.sampling_logprobs if tempered else c.logprobs)
  e.weight_versions.append(c.weight_version)
  turn = Turn(text=c.text, span=(start, len(e.ids)), finish_reason=c.finish_reason,
              records=tuple(st.records))
  e.turns.append(turn)
  history = list(e.messages)
  e.messages.append({"role": "assistant", "content": c.text})
  if st.done:
    e.done = True
    return
  if len(e.turns) >= caps.max_turns:
    e.truncated, e.done = "max_turns", True
  elif env.tool_seconds() >= caps.max_tool_s:
    e.truncated, e.done = "tool_time", True
  if e.done:
    return
  last = c.token_ids[-1] if c.token_ids else None
  stop_text = (renderer.tokenizer.decode([last]) if last is not None and last == eos
               and c.finish_reason == "stop" else "")
  new = renderer.adapt(st.messages)
  ids, rewritten = renderer.env_ids(history, c.text, stop_text, new)
  if e.context_len + len(ids) >= caps.max_context_tokens:
    # The answer leaves the model no token to reply with: the episode ends before it
    # (its tool records stay on the turn). Appended, a flood of masked tool output
    # would outgrow the cap in the learner's rows (measured: a 2000-token answer in a
    # 448-token episode made one step's packed window 2056 tokens and took 330 s).
    e.truncated, e.done = "max_context", True
    return
  e.template_rewrites += int(rewritten)
  e.ids += ids
  e.mask += [False] * len(ids)
  e.logprobs += [0.0] * len(ids)
  e.messages += new
  turn.env_messages, turn.env_tokens = tuple(new), len(ids)


def score(verdict: RewardResult, violations: Sequence[str], truncated: str | None,
          caps: EpisodeCaps, config: registry.RewardConfig | None = None) -> RewardResult:
  """The verifier's verdict on the final state, with the episode's own violations
  priced in, and the truncation rule applied. A verifier failure is passed on as it
  is (no verdict: never trained)."""
  if registry.verifier_failure(verdict) is not None:
    return verdict
  config = config or registry.get_config()
  allv = tuple(dict.fromkeys(tuple(verdict.violations) + tuple(violations)))
  reward = verdict.score - config.penalty(allv)
  details = dict(verdict.details)
  if truncated:
    details["truncated"] = truncated
    if caps.truncated_reward == "zero":
      reward = 0.0
  return RewardResult(score=verdict.score, violations=allv, reward=reward, details=details)


def score_rollout(verdict: RewardResult, rollout: Rollout, caps: EpisodeCaps,
                  config: registry.RewardConfig | None = None) -> RewardResult:
  """`score` for an episode held as a Rollout (its turns' tool violations, the cap
  on its last turn); a single-turn rollout's verdict is returned as it is."""
  if not rollout.turns:
    return verdict
  violations = [c["violation"] for t in rollout.turns for c in t.get("tools", ())
                if c.get("violation")]
  return score(verdict, violations, rollout.turns[-1].get("truncated"), caps, config)


def stop_token_id(tokenizer: Any) -> int | None:
  """The token that ends a model turn (the tokenizer's EOS; the first, where it
  names several), appended to every demonstrated turn; None without one."""
  eos = getattr(tokenizer, "eos_token_id", None)
  if isinstance(eos, (list, tuple)):
    eos = eos[0] if eos else None
  return None if eos is None else int(eos)


def demonstration_ids(renderer: Renderer, opening: Sequence[dict[str, str]],
                      turns: Sequence[tuple[str, Sequence[dict[str, str]]]]
                      ) -> tuple[list[int], list[int], list[bool]]:
  """(prompt ids, ids, mask) of a scripted episode, as `run_episodes` would hold it
  had the model written these turns: the opening messages rendered, then per turn
  the assistant text's ids and the stop token (mask True) and the environment's
  messages after it, rendered by `Renderer.env_ids` (mask False). `turns`: (text,
  messages) pairs, no messages after the last (an environment's `demonstration`)."""
  tok = renderer.tokenizer
  eos = stop_token_id(tok)
  msgs = renderer.adapt(opening)
  prompt = renderer.opening(msgs)
  ids: list[int] = []
  mask: list[bool] = []
  for k, (text, new) in enumerate(turns):
    turn = list(tok.encode(text, add_special_tokens=False)) + ([eos] if eos is not None else [])
    ids += turn
    mask += [True] * len(turn)
    if k == len(turns) - 1:
      if new:
        raise ValueError("demonstration_ids: the last turn has environment messages after it")
      break
    adapted = renderer.adapt(new)
    env, _ = renderer.env_ids(msgs, text, tok.decode([eos]) if eos is not None else "", adapted)
    ids += env
    mask += [False] * len(env)
    msgs += [{"role": "assistant", "content": text}] + adapted
  return prompt, ids, mask
