"""Tasks -> rollouts, one path for single-turn and episodic domains.

    rollouts = generation.generate(engine, tasks, n=8, sampling=sp, seeds=seeds,
                                   episodes=settings.episodes, tokenizer=tok)

Rollouts come back n per task, in task order (group g = rollouts[g*n:(g+1)*n]).
A task of an ordinary domain is one request (its chat messages, `Task.messages`)
with n samples seeded by its seed; a task of an episodic domain (rlpt.envs.registry,
e.g. "python_tool") is played as n episodes of its environment (rlpt.envs.episode:
token-exact, the environment's tokens masked, KV reuse across turns on the
JaxEngine), sample j seeded by `episode_seed(seed, j)`. Both kinds share a round,
one after the other: the single-turn requests in one engine call, then the episodes
(all of them in one continued call on the JaxEngine).

Verification stays the registry's (rlpt.rewards): a rollout's verifier scores its
`scored_text` (an episode's final state), and `finish` prices an episode's own
violations in and applies its truncation rule (rlpt.envs.episode.score_rollout).

Sessions: an episode's sandbox session comes from the default sandbox pool
(rlpt.sandbox.default_pool) and is released as soon as its episode ends. A session
whose sandbox dies raises rlpt.sandbox.SessionLost out of `generate`: an
infrastructure failure, which the scheduler retries and never scores.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from rlpt.envs import episode as ep_lib
from rlpt.envs import registry as env_registry
from rlpt.envs.sandbox_tools import ToolLimits
from rlpt.rewards import registry
from rlpt.rollout import requests as req_lib
from rlpt.rollout.engine import Completion, GenerateRequest, RolloutEngine, SamplingParams
from rlpt.types import RewardResult, Rollout, Task


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
  """config.episodes: how episodic domains are played.

  caps: per-episode limits (turns, context tokens, tool seconds, the reward of a
    truncated episode).
  tools: per-call and per-episode tool limits (calls, seconds, output).
  with_tools: offer the environment's tools (False: the same episodes without them,
    e.g. the "without the tool" column of an evaluation).
  kv_reuse: continue each episode from its KV cache (None: where the engine can).
  """

  caps: ep_lib.EpisodeCaps = ep_lib.EpisodeCaps()
  tools: ToolLimits = ToolLimits(max_calls=4)
  with_tools: bool = True
  kv_reuse: bool | None = None


def is_episodic(task: Task) -> bool:
  return env_registry.is_episodic(task.domain)


def opening(task: Task, episodes: EpisodeSettings) -> list[dict[str, str]]:
  """The messages an episode of `task` opens with (its environment's `reset`)."""
  env = env_registry.make(task.domain, None, episodes.tools, with_tools=episodes.with_tools)
  try:
    return env.reset(task)
  finally:
    env.close()


def prompt_length(task: Task, tokenizer: Any, episodes: EpisodeSettings | None = None) -> int:
  """Tokens of `task`'s prompt as the engine sees it (its opening messages rendered
  with the chat template and the generation prompt): what rollout.max_prompt_len
  bounds."""
  if is_episodic(task):
    return len(ep_lib.Renderer(tokenizer).opening(opening(task, episodes or EpisodeSettings())))
  return len(req_lib.prompt_ids(GenerateRequest(messages=task.messages()), tokenizer, 0))


def requests_for(tasks: Sequence[Task], *, n: int, sampling: SamplingParams,
                 seeds: Sequence[int]) -> list[GenerateRequest]:
  """One request per task (its chat messages, `Task.messages`), `n` samples, seeded per
  prompt."""
  return [GenerateRequest(messages=t.messages(), n=n,
                          sampling=dataclasses.replace(sampling, seed=int(s)),
                          request_id=f"{t.domain}:{i}")
          for i, (t, s) in enumerate(zip(tasks, seeds))]


def to_rollouts(tasks: Sequence[Task], completions: Sequence[Completion], *, n: int,
                first_group: int = 0, temperature: float = 1.0) -> list[Rollout]:
  """Completions (request order, samples in order) -> Rollouts with group ids (and
  the completion's dispatch attempt). Rollout.logprobs are under the distribution the
  learner trains: the policy's own (Completion.logprobs) at temperature 1 or 0, the
  sampling distribution's (Completion.sampling_logprobs, softmax(logits / T)) at any
  other `temperature` (AlgoSpec.temperature)."""
  if len(completions) != len(tasks) * n:
    raise ValueError(f"engine returned {len(completions)} completions for {len(tasks)} "
                     f"prompts x n={n}")
  tempered = temperature not in (0.0, 1.0)
  out = []
  for j, c in enumerate(completions):
    g = j // n
    out.append(Rollout(task=tasks[g], prompt_ids=list(c.prompt_ids),
                       completion_ids=list(c.token_ids), completion_text=c.text,
                       logprobs=list(c.sampling_logprobs if tempered else c.logprobs),
                       weight_version=c.weight_version,
                       finish_reason=c.finish_reason, group_id=first_group + g,
                       attempt=int(c.attempt),
                       token_versions=(list(c.token_versions) if c.token_versions is not None
                                       else None)))
  return out


def episode_seed(seed: int | None, sample: int) -> int | None:
  """The sampling seed of episode `sample` of a group seeded `seed`."""
  return None if seed is None else (int(seed) * 1_000_003 + int(sample)) % (2 ** 31 - 1)


def generate(engine: RolloutEngine, tasks: Sequence[Task], *, n: int, sampling: SamplingParams,
             seeds: Sequence[int], first_group: int = 0,
             episodes: EpisodeSettings | None = None, tokenizer: Any = None,
             pool: Any = None) -> list[Rollout]:
  """n rollouts per task, in task order, unverified (module docstring). tokenizer:
  renders episodes (the engine's own when None); pool: the sandbox pool episodes
  take their sessions from (the default pool when None)."""
  if len(seeds) != len(tasks):
    raise ValueError(f"generate: {len(seeds)} seeds for {len(tasks)} tasks")
  single = [g for g, t in enumerate(tasks) if not is_episodic(t)]
  multi = [g for g, t in enumerate(tasks) if is_episodic(t)]
  out: list[Rollout | None] = [None] * (len(tasks) * n)
  if single:
    ts = [tasks[g] for g in single]
    comps = engine.generate(requests_for(ts, n=n, sampling=sampling,
                                         seeds=[seeds[g] for g in single]))
    for j, r in enumerate(to_rollouts(ts, comps, n=n, temperature=sampling.temperature)):
      g = single[j // n]
      r.group_id = first_group + g
      out[g * n + j % n] = r
  if multi:
    for (g, k), r in zip([(g, k) for g in multi for k in range(n)],
                         _episodes(engine, tasks, multi, n, sampling, seeds, episodes,
                                   tokenizer, pool)):
      r.group_id = first_group + g
      out[g * n + k] = r
  return [r for r in out if r is not None]


def _episodes(engine, tasks, multi, n, sampling, seeds, episodes, tokenizer, pool):
  episodes = episodes or EpisodeSettings()
  tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
  if tokenizer is None:
    raise ValueError("episodic tasks need the engine's tokenizer to render their turns")
  if pool is None and episodes.with_tools:
    from rlpt import sandbox
    pool = sandbox.default_pool()
  ep_tasks, envs, ep_seeds = [], [], []
  for g in multi:
    for k in range(n):
      ep_tasks.append(tasks[g])
      envs.append(env_registry.make(tasks[g].domain, pool, episodes.tools,
                                    with_tools=episodes.with_tools))
      ep_seeds.append(episode_seed(seeds[g], k))
  renderer = ep_lib.Renderer(tokenizer)
  sampling = dataclasses.replace(sampling, max_wall_s=None)  # episodes: their own caps
  eps = ep_lib.play_episodes(engine, renderer, envs, ep_tasks, sampling=sampling,
                             caps=episodes.caps, tempered=sampling.temperature not in (0.0, 1.0),
                             kv_reuse=episodes.kv_reuse, seeds=ep_seeds)
  return [e.to_rollout(tokenizer=tokenizer) for e in eps]


def finish(rollouts: Sequence[Rollout], verdicts: Sequence[RewardResult],
           episodes: EpisodeSettings | None = None,
           reward_config: registry.RewardConfig | None = None) -> list[RewardResult]:
  """The verifier's verdicts on `rollouts`' scored texts, with each episode's own
  violations and truncation rule applied (single-turn verdicts pass unchanged)."""
  caps = (episodes or EpisodeSettings()).caps
  return [ep_lib.score_rollout(v, r, caps, reward_config) for r, v in zip(rollouts, verdicts)]
