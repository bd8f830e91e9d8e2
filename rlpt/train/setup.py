"""Checking an RL config and building what the loop joins (model, engine, learner, mixer).

    setup.check_config(config)          # ConfigError naming the field; loads nothing
    ctx = setup.build(config, workdir)  # Context

`check_config` runs before any model is loaded: field ranges, the algorithm
choices (rlpt.algorithms.AlgoSpec), the model name, that every configured domain
has a verifier and a task source, and the mesh against the visible devices.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

import jax
import numpy as np

from rlpt.data import mixer as mixer_lib
from rlpt.rollout.engine import SamplingParams
from rlpt.train import policy as policy_lib


class ConfigError(ValueError):
  """The config cannot run; the message names the field and what was expected."""


def _domains(config) -> dict[str, float]:
  d = config.data.domains
  return dict(d.to_dict() if hasattr(d, "to_dict") else d)


def task_source(domain: str, *, seed: int, synthetic_length=(2, 2),
                math_generators: str = "", rg_config: Any = None) -> mixer_lib.TaskSource:
  """The task source of `domain` (rlpt.data.synthetic, or rlpt.data.sources).

  `math_generators`: comma-separated reasoning-gym generators of the "math" domain
  (config.data.math_generators; empty = rlpt.data.sources.math_tasks.GENERATORS).
  `rg_config`: {generator field: value} for an "rg/..." domain
  (config.data.rg_config[domain]; e.g. {"max_digits": 1}), checked by drawing a task.
  """
  if rg_config and domain.startswith("rg/"):
    from rlpt.data.sources import rg_tasks
    fields = tuple(sorted(dict(rg_config).items()))
    src = rg_tasks.RGSource(domain[3:], seed, config=fields)
    try:
      src.train(0)
    except ValueError as e:
      raise ConfigError(f"data.rg_config.{domain}: {e}") from e
    return src
  if domain == "synthetic" or domain.startswith("synthetic/"):
    from rlpt.data import synthetic
    ops = tuple(domain.split("/", 1)[1].split("+")) if "/" in domain else ("copy",)
    lo, hi = int(synthetic_length[0]), int(synthetic_length[-1])
    return synthetic.SyntheticSource(ops=ops, seed=seed, domain=domain, length=(lo, hi))
  try:
    from rlpt.data import sources
  except ImportError as e:
    raise ConfigError(f"data.domains: domain {domain!r} needs rlpt.data.sources, which is not "
                      f"built yet ({e})") from e
  if domain == "math" and math_generators:
    from rlpt.data.sources import math_tasks
    names = tuple(g.strip() for g in str(math_generators).split(",") if g.strip())
    try:
      return math_tasks.MathSource(generators=names, seed=seed)
    except ValueError as e:
      raise ConfigError(f"data.math_generators: {e}") from e
  try:
    return sources.get_source(domain, seed=seed)
  except KeyError as e:
    raise ConfigError(f"data.domains: no task source for domain {domain!r}: {e}") from e


def config_task_source(config, domain: str) -> mixer_lib.TaskSource:
  """`task_source` of `domain` with the config's seed and data.* settings."""
  return task_source(domain, seed=config.seed, synthetic_length=_syn_len(config),
                     math_generators=config.data.get("math_generators", ""),
                     rg_config=_rg_config(config, domain))


def _rg_config(config, domain: str) -> dict[str, Any] | None:
  """config.data.rg_config[domain] as a plain dict (None when absent)."""
  table = config.data.get("rg_config", None)
  if not table or domain not in table:
    return None
  entry = table[domain]
  return dict(entry.to_dict() if hasattr(entry, "to_dict") else entry)


def _syn_len(config) -> tuple[int, int]:
  n = config.data.get("synthetic_length", (2, 2))
  return (int(n), int(n)) if isinstance(n, int) else (int(n[0]), int(n[-1]))


def check_config(config: Any):
  """Raises ConfigError for anything that would fail later; returns the AlgoSpec."""
  def need(ok, field, what):
    if not ok:
      value = config
      for part in field.split("."):
        value = value.get(part) if hasattr(value, "get") else None
      raise ConfigError(f"config.{field} = {value!r}: expected {what}")

  need(config.total_steps >= 1, "total_steps", "an integer >= 1")
  need(config.rollout.n >= 1, "rollout.n", "samples per prompt >= 1")
  need(config.rollout.max_new_tokens >= 1, "rollout.max_new_tokens", ">= 1")
  need(config.rollout.temperature >= 0, "rollout.temperature", ">= 0")
  need(0 < config.rollout.top_p <= 1, "rollout.top_p", "a value in (0, 1]")
  need(config.rollout.engine == "jax", "rollout.engine",
       "'jax' (the synchronous loop runs the embedded JaxEngine)")
  need(config.data.prompts_per_step >= 1, "data.prompts_per_step", ">= 1")
  need(config.data.holdout_per_domain >= 0, "data.holdout_per_domain", ">= 0")
  need(config.eval.every >= 0, "eval.every", ">= 0 (0 = only at the end)")
  need(config.checkpoint.every >= 1, "checkpoint.every", ">= 1")
  need(config.checkpoint.keep >= 1, "checkpoint.keep", ">= 1")
  rows = config.data.prompts_per_step * config.rollout.n
  mbs = min(config.rl.microbatch_size, rows)
  need(mbs >= 1 and rows % mbs == 0, "rl.microbatch_size",
       f"a divisor of prompts_per_step x rollout.n = {rows}")
  from rlpt.algorithms.spec import AlgoSpec
  try:
    spec = AlgoSpec.from_config(config.rl, max_new_tokens=config.rollout.max_new_tokens)
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e)) from e
  if spec.advantage in ("group_norm", "group_mean", "rloo") or config.rl.dynamic_sampling:
    need(config.rollout.n >= 2, "rollout.n",
         f">= 2 for group-relative advantages ({spec.advantage})")
  why = policy_lib.check_model_name(str(config.model.name))
  if why:
    raise ConfigError(why)
  domains = _domains(config)
  if not domains:
    raise ConfigError("config.data.domains is empty: expected {domain: weight, ...}")
  from rlpt import rewards
  for d, w in domains.items():
    if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
      raise ConfigError(f"config.data.domains.{d} = {w!r}: expected a weight >= 0")
    if not d.startswith("synthetic") and d not in rewards.VERIFIER_REGISTRY:
      close = difflib.get_close_matches(d, list(rewards.VERIFIER_REGISTRY), n=3)
      raise ConfigError(f"config.data.domains: no verifier registered for domain {d!r}"
                        + (f"; did you mean {close}?" if close else ""))
    config_task_source(config, d)  # ConfigError if none
  mesh = dict(config.mesh)
  size = int(np.prod(list(mesh.values())))
  need(size <= len(jax.devices()), "mesh",
       f"axis sizes whose product ({size}) fits the {len(jax.devices())} visible devices")
  return spec


@dataclasses.dataclass
class Context:
  """Everything the loop drives."""

  config: Any
  model: Any
  tokenizer: Any
  engine: Any
  learner: Any                 # set by `make_learner` (after SFT, if any)
  mixer: mixer_lib.DomainMixer
  sources: dict[str, Any]
  mesh: Any
  holdout: dict[str, list]
  sampling: SamplingParams
  reward_config: Any
  pad_id: int


def make_mesh(config):
  axes = ("data", "fsdp", "tensor", "seq")
  sizes = [int(config.mesh.get(a, 1)) for a in axes]
  if int(np.prod(sizes)) <= 1:
    return None
  devs = np.array(jax.devices()[:int(np.prod(sizes))]).reshape(sizes)
  return jax.sharding.Mesh(devs, axes)


def reward_config(config):
  from rlpt import rewards
  pen = dict(rewards.RewardConfig().penalties)
  pen.update({k: float(v) for k, v in dict(config.rewards.penalties).items()})
  return rewards.RewardConfig(penalties=pen, timeout_s=float(config.rewards.timeout_s))


def build(config: Any, workdir: Any, *, model=None, tokenizer=None) -> Context:
  """Loads the policy (or takes `model`), builds engine, mixer, holdout (the
  learner comes from `make_learner`, once SFT has run)."""
  from rlpt.data import synthetic
  from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig
  domains = _domains(config)
  if any(d.startswith("synthetic") for d in domains):
    from rlpt.rewards import registry
    for d in domains:
      if d.startswith("synthetic"):
        registry.register(d, registry.FunctionVerifier(synthetic.verify, isolation="inline"))
  sources = {d: config_task_source(config, d) for d in domains}
  mixer = mixer_lib.DomainMixer(
      sources, domains, seed=config.seed,
      curriculum=mixer_lib.Curriculum(kind=str(config.data.get("curriculum", "none"))))
  holdout = {d: s.holdout(config.data.holdout_per_domain) for d, s in sources.items()
             } if config.data.holdout_per_domain else {}
  mesh = make_mesh(config)
  if model is None:
    ops = tuple(s.ops for s in sources.values() if hasattr(s, "ops"))
    model, tokenizer = policy_lib.load_policy(config.model, seed=config.seed, mesh=mesh,
                                              synthetic_ops=ops)
  prompt_len = 512 if str(config.model.name) != "tiny" else 64
  engine = JaxEngine(model, tokenizer, JaxEngineConfig(
      max_batch=int(config.rollout.get("max_batch", 64)),
      max_len=prompt_len + int(config.rollout.max_new_tokens),
      kv_cache_mib=float(config.rollout.kv_cache_mb),
      min_prompt_bucket=16 if str(config.model.name) == "tiny" else 32,
      length_multiple=16 if str(config.model.name) == "tiny" else 64,
      seed=int(config.seed)))
  # Sync once so the engine's weights have the placement every later update gives
  # them (a fresh model's arrays may be uncommitted, which would compile twice).
  engine.update_weights(model, version=0)
  sampling = SamplingParams(max_new_tokens=int(config.rollout.max_new_tokens),
                            temperature=float(config.rollout.temperature),
                            top_p=float(config.rollout.top_p), top_k=int(config.rollout.top_k))
  pad = getattr(tokenizer, "pad_token_id", None)
  if pad is None:
    pad = getattr(tokenizer, "eos_token_id", None) or 0
  return Context(config=config, model=model, tokenizer=tokenizer, engine=engine,
                 learner=None, mixer=mixer, sources=sources, mesh=mesh, holdout=holdout, sampling=sampling,
                 reward_config=reward_config(config), pad_id=int(pad))


def make_learner(ctx: Context):
  """The learner over `ctx.model` (its current weights are also the KL reference)."""
  from rlpt.train.learner import Learner
  ctx.learner = Learner.from_config(ctx.model, ctx.config, mesh=ctx.mesh)
  return ctx.learner
