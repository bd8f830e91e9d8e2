"""Builds what an RL run joins, from its Settings: task sources and mixer, the policy,
the rollout engine (embedded JaxEngine or the fleet), the learner.

    settings = Settings.from_config(config)       # rlpt.train.settings, loads nothing
    parts = build.build(settings, workdir)        # Parts: model, tokenizer, engine, mixer, ...
    learner = build.learner(parts)                # after SFT: its weights are the KL reference
    sync = build.weight_sync(parts, workdir)      # WeightSync for parts.engine

This is the only place that loads a model or starts rollout servers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging
import jax

from rlpt.data import mixer as mixer_lib
from rlpt.envs import registry as env_registry
from rlpt.train import policy as policy_lib
from rlpt.train.settings import ConfigError, DataSettings, Settings


def task_source(domain: str, data: DataSettings, *, seed: int) -> mixer_lib.TaskSource:
  """The task source of `domain`: rlpt.data.synthetic for "synthetic[/ops]", a
  reasoning-gym source with `data.rg_config[domain]`'s generator fields, the "math"
  source over `data.math_generators`, "code_repair" over the files up to
  `data.code_repair_max_chars`, "extraction" with reports of `data.extraction_tokens`
  and `data.extraction_fields`, else the built-in rlpt.data.sources one.
  Raises ConfigError naming the field when none can be made."""
  rg_fields = data.rg_fields(domain)
  if rg_fields and domain.startswith("rg/"):
    from rlpt.data.sources import rg_tasks
    src = rg_tasks.RGSource(domain[3:], seed, config=rg_fields)
    try:
      src.train(0)
    except ValueError as e:
      raise ConfigError(f"data.rg_config.{domain}: {e}") from e
    return src
  if domain == "synthetic" or domain.startswith("synthetic/"):
    from rlpt.data import synthetic
    ops = tuple(domain.split("/", 1)[1].split("+")) if "/" in domain else ("copy",)
    n = data.synthetic_length
    return synthetic.SyntheticSource(ops=ops, seed=seed, domain=domain, length=(n, n))
  from rlpt.data import sources
  if domain == "math" and data.math_generators:
    from rlpt.data.sources import math_tasks
    try:
      return math_tasks.MathSource(generators=data.math_generators, seed=seed)
    except ValueError as e:
      raise ConfigError(f"data.math_generators: {e}") from e
  if domain == "extraction":
    from rlpt.data.sources import extraction_tasks
    try:
      return extraction_tasks.ExtractionSource(tokens=data.extraction_tokens,
                                               fields=data.extraction_fields, seed=seed)
    except ValueError as e:
      raise ConfigError(f"data.extraction_tokens / data.extraction_fields: {e}") from e
  if domain == "code_repair" and data.code_repair_max_chars:
    from rlpt.data.sources import repair_tasks
    src = repair_tasks.CodeRepairSource(seed=seed, max_solution_chars=data.code_repair_max_chars)
    if not src.size("train") or not src.size("holdout"):
      raise ConfigError(f"data.code_repair_max_chars = {data.code_repair_max_chars}: no "
                        f"shipped code_repair mutant in train or holdout is that short "
                        f"(train {src.size('train')}, holdout {src.size('holdout')})")
    return src
  try:
    return sources.get_source(domain, seed=seed)
  except KeyError as e:
    raise ConfigError(f"data.domains: no task source for domain {domain!r}: {e}") from e


@dataclasses.dataclass
class Parts:
  """What `build` made. `engine` is a RolloutEngine: a JaxEngine, or a Fleet whose
  members serve the policy (then `publisher` writes the versions they load)."""

  settings: Settings
  model: Any
  tokenizer: Any
  engine: Any
  mixer: mixer_lib.DomainMixer
  sources: dict[str, Any]
  holdout: dict[str, list]
  mesh: Any
  pad_id: int


def make_mesh(settings: Settings):
  """The run's ("data", "fsdp", "tensor", "seq") mesh, or None on one device."""
  from rlpt.models.sharding import make_mesh as mesh_of
  sizes = dict(settings.mesh)
  if sizes and max(sizes.values()) > 1:
    return mesh_of(**sizes)
  return None


def make_mixer(s: Settings, sources: dict[str, mixer_lib.TaskSource]) -> mixer_lib.DomainMixer:
  """The run's domain mixer over `sources` (config.data: weights, curriculum, guard)."""
  return mixer_lib.DomainMixer(sources, s.data.weights, seed=s.seed,
                               curriculum=mixer_lib.Curriculum(
                                   kind=s.data.curriculum,
                                   forgetting_margin=s.data.forgetting_margin,
                                   forgetting_boost=s.data.forgetting_boost,
                                   cover_first=s.data.cover_domains_first))


def fitting(tasks: list, tokenizer: Any, max_prompt_len: int, domain: str,
            episodes: Any = None) -> list:
  """The holdout `tasks` whose chat-templated prompt fits rollout.max_prompt_len (the
  engine cannot decode the others; training dead-letters them as prompt_too_long), in
  order; logs how many of the domain's tasks were left out."""
  from rlpt.train.generation import prompt_length
  keep = [t for t in tasks if prompt_length(t, tokenizer, episodes) <= max_prompt_len]
  if len(keep) < len(tasks):
    logging.warning("holdout %s: %d of %d tasks left out, their prompts are longer than "
                    "rollout.max_prompt_len = %d tokens", domain, len(tasks) - len(keep),
                    len(tasks), max_prompt_len)
  return keep


def check_episodic_template(s: Settings, tokenizer: Any = None) -> None:
  """ConfigError unless the model's chat template can render tool turns, when the
  run has episodic domains (rlpt.envs.registry); reads the tokenizer only, before any
  weights load (`tokenizer`: one already loaded)."""
  episodic = sorted(d for d, _ in s.data.domains if env_registry.is_episodic(d))
  if not episodic:
    return
  from rlpt.envs.episode import check_template
  where = f"data.domains has episodic domains {episodic}, but model.name = {s.model.name!r}"
  if tokenizer is None:
    if s.model.name == "tiny":
      raise ConfigError(f"{where}: the tiny model's tokenizer has no chat template")
    from rlpt.models.loading import load_tokenizer_of
    tokenizer = load_tokenizer_of(s.model.name)
  try:
    check_template(tokenizer)
  except ValueError as e:
    raise ConfigError(f"{where}: {e}") from e


def build(settings: Settings, workdir: Any, *, model=None, tokenizer=None) -> Parts:
  """Loads the policy (or takes `model`), builds the engine, the mixer and the holdout
  (the learner comes from `learner(parts)`, once SFT has run)."""
  s = settings
  weights = s.data.weights
  sources = {d: task_source(d, s.data, seed=s.seed) for d in weights}
  mixer = make_mixer(s, sources)
  mesh = make_mesh(s)
  check_episodic_template(s, tokenizer)
  if model is None:
    ops = tuple(src.ops for src in sources.values() if hasattr(src, "ops"))
    model, tokenizer = policy_lib.load_policy(s.model, seed=s.seed, mesh=mesh, synthetic_ops=ops)
  holdout = ({d: fitting(src.holdout(s.data.holdout_per_domain), tokenizer,
                         s.rollout.max_prompt_len, d, s.episodes) for d, src in sources.items()}
             if s.data.holdout_per_domain else {})
  pad = getattr(tokenizer, "pad_token_id", None)
  if pad is None:
    pad = getattr(tokenizer, "eos_token_id", None) or 0
  engine = make_engine(s, model, tokenizer, workdir)
  return Parts(settings=s, model=model, tokenizer=tokenizer, engine=engine, mixer=mixer,
               sources=sources, holdout=holdout, mesh=mesh, pad_id=int(pad))


def make_engine(s: Settings, model, tokenizer, workdir):
  """The rollout engine of `s.rollout.engine`, serving `model`'s weights as version 0."""
  if s.rollout.engine == "fleet":
    from rlpt.train import fleet_engine
    return fleet_engine.start_fleet(s, model, tokenizer, workdir)
  return embedded_engine(s, model, tokenizer)


def embedded_engine(s: Settings, model, tokenizer):
  """A JaxEngine in this process with the run's engine sizes, serving `model`'s weights
  as version 0."""
  from rlpt.rollout.jax_engine import JaxEngine
  if jax.process_count() > 1:
    # Each process generates its share of every round with its own engine on its own
    # first device (rlpt.train.process_rounds); weight syncs gather the global
    # parameters to every host (rlpt.train.weight_sync).
    model = local_copy(model)
  engine = JaxEngine(model, tokenizer, s.engine_config())
  # Sync once so the engine's weights have the placement every later update gives
  # them (a fresh model's arrays may be uncommitted, which would compile twice).
  engine.update_weights(model, version=0)
  return engine


class EvalEngine:
  """The engine holdouts are decoded on (`eval.engine`), serving the weights asked for.

      engine = EvalEngine(parts)
      evaluation.evaluate(engine.serving(params, version), holdout, ...)

  "rollout" (or rollout.engine = "jax"): the run's rollout engine, which the caller has
  already synced to the version. "learner" with the fleet: an embedded JaxEngine in
  this process, built at the first evaluation and handed the learner's parameters in
  place (no publish, no member load). Not faster on the 2-core machine: for
  configs/default.py through the fleet the after-SFT holdout took about 7.7 min on the
  members and about 7.5 on this engine (docs/benchmarks.md)."""

  def __init__(self, parts: Parts):
    self.parts = parts
    s = parts.settings
    self.separate = s.eval_engine == "learner" and s.rollout.engine == "fleet"
    self._engine: Any = None

  def serving(self, params: Any, version: int) -> Any:
    """The engine to decode on, serving `params` (a Decoder, nnx.State or arrays dict)
    as `version` when it is the learner's own engine; the rollout engine as it is
    otherwise."""
    if not self.separate:
      return self.parts.engine
    from rlpt.train.weight_sync import param_dict
    if self._engine is None:
      self._engine = embedded_engine(self.parts.settings, self.parts.model, self.parts.tokenizer)
    params = param_dict(params)
    if jax.process_count() > 1:   # global arrays: every process's engine gets them whole
      from rlpt.train import distributed
      params = jax.tree.map(distributed.host_value, params)
    self._engine.update_weights(params, version=int(version))
    return self._engine


def local_copy(model):
  """`model` with every (possibly multi-process) array gathered whole onto this
  process's first device."""
  from flax import nnx
  from rlpt.train import distributed
  graphdef, state = nnx.split(model)
  device = jax.local_devices()[0]
  return nnx.merge(graphdef, jax.tree.map(
      lambda x: jax.device_put(distributed.host_value(x), device), state))


def learner(parts: Parts):
  """The learner over `parts.model` (its current weights are also the KL reference)."""
  from rlpt.train.learner import Learner
  rl = parts.settings.rl
  return Learner(parts.model, rl.algo, rl.optim, microbatch_size=rl.microbatch_size,
                 mesh=parts.mesh, share_prompts=rl.share_prompts,
                 length_multiple=rl.length_multiple, max_staleness=rl.max_staleness,
                 window_multiple=rl.window_multiple)


def weight_sync(parts: Parts, workdir: Any):
  """The run's WeightSync: in process for the embedded engine, through published Orbax
  versions (WORKDIR/weights) for the fleet."""
  from rlpt.train.weight_sync import WeightSync
  if parts.settings.rollout.engine != "fleet":
    return WeightSync(parts.engine)
  from rlpt.train import fleet_engine
  return fleet_engine.weight_sync(parts, workdir)
