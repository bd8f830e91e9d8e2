"""An RL experiment's config, read once into typed, frozen settings.

    settings = Settings.from_config(config)   # ConfigError naming the field; loads nothing

`from_config` is the only code that reads the ConfigDict: everything the run builds
(model, engine or fleet, mixer, learner, SFT, checkpoints) takes these objects. It
checks ranges and choices, the algorithm (rlpt.algorithms.AlgoSpec), the model name,
that every configured domain has a verifier and a task source (drawing a task from
each, so a bad reasoning-gym field fails here), the mesh against the visible
devices, and that every field of the config is read by something: a field nothing
reads (a stale or misspelt one added by a config file) is a ConfigError too.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

import jax
import numpy as np

from rlpt.algorithms.spec import AlgoSpec
from rlpt.rewards.registry import RewardConfig
from rlpt.rollout.engine import SamplingParams
from rlpt.rollout.jax_engine import JaxEngineConfig
from rlpt.train.generation import EpisodeSettings
from rlpt.train.optim import OptimConfig
from rlpt.train.scheduler import SchedulerSettings
from rlpt.train.sft import SFTConfig

ENGINES = ("jax", "fleet")
# Where the holdout is decoded: "rollout" = the run's rollout engine (with the fleet,
# its members after loading the version); "learner" = an embedded JaxEngine in the
# learner's process fed the learner's parameters in place (the same engine as
# "rollout" when rollout.engine = "jax").
EVAL_ENGINES = ("rollout", "learner")
RL_MODES = ("sync", "async")
INFLIGHT = ("finish", "abort", "continue")
GATE_KEEP = ("all", "observed")   # rl.gate_keep: see rlpt.train.async_collector
FLEET_KINDS = ("server", "url")
MESH_AXES = ("data", "fsdp", "tensor", "seq")


class ConfigError(ValueError):
  """The config cannot run; the message names the field and what was expected."""


def _plain(v: Any) -> Any:
  return v.to_dict() if hasattr(v, "to_dict") else v


class _Reader:
  """Reads dotted fields of a ConfigDict and remembers which ones were read."""

  def __init__(self, config):
    self.config = config
    self.read: set[str] = set()

  def __call__(self, path: str) -> Any:
    node = self.config
    for part in path.split("."):
      if not hasattr(node, "keys") or part not in node.keys():
        raise ConfigError(f"config.{path} is missing (the base config, configs/common.py, "
                          f"defines it)")
      node = node[part]
    self.read.add(path)
    return _plain(node)

  def unread(self) -> list[str]:
    out = []

    def walk(node, prefix):
      for k in node.keys():
        path = f"{prefix}{k}"
        if any(path == r or path.startswith(r + ".") for r in self.read):
          continue
        v = node[k]
        if hasattr(v, "keys") and len(v.keys()):
          walk(v, path + ".")
        else:
          out.append(path)
    walk(self.config, "")
    return sorted(out)


def _need(ok: bool, field: str, value: Any, what: str) -> None:
  if not ok:
    raise ConfigError(f"config.{field} = {value!r}: expected {what}")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """config.model: `name` (a load_model path, "smollm2-135m-instruct" or "tiny"),
  `dtype`, `remat`, the tiny model's sizes, and a context longer than the checkpoint's
  (`context_length` tokens, 0 = the checkpoint's; `rope_scaling` items, () = the
  checkpoint's)."""

  name: str
  dtype: str = "float32"
  remat: bool = False
  tiny: tuple[tuple[str, int], ...] = ()
  context_length: int = 0
  rope_scaling: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """config.rollout: which engine, how to sample, and the engine's sizes."""

  engine: str
  n: int
  max_new_tokens: int
  temperature: float
  top_p: float
  top_k: int
  kv_cache_mb: float
  max_batch: int
  max_prompt_len: int
  min_prompt_bucket: int
  length_multiple: int
  max_wall_s: float = 0.0   # per-sample wall cap, seconds (0 = none; SamplingParams.max_wall_s)

  def sampling(self) -> SamplingParams:
    return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                          top_p=self.top_p, top_k=self.top_k,
                          max_wall_s=self.max_wall_s or None)

  def engine_config(self, seed: int, min_len: int = 0) -> JaxEngineConfig:
    """The JaxEngine settings of the embedded engine and of every fleet server; the
    context holds max_prompt_len + max_new_tokens tokens, or `min_len` if more (an
    episode's whole context, Settings.engine_config)."""
    return JaxEngineConfig(max_batch=self.max_batch,
                           max_len=max(self.max_prompt_len + self.max_new_tokens, int(min_len)),
                           kv_cache_mib=self.kv_cache_mb, min_prompt_bucket=self.min_prompt_bucket,
                           length_multiple=self.length_multiple, seed=seed)


@dataclasses.dataclass(frozen=True)
class FleetSettings:
  """config.fleet (+ config.ray.address): the rollout fleet of rollout.engine="fleet"."""

  kind: str = "server"
  members: int = 2
  urls: tuple[str, ...] = ()
  load_hf: bool = True
  startup_timeout_s: float = 600.0
  ray_address: str = ""
  placement: str = "auto"


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """config.data: domains and weights, batch and holdout sizes, generator settings."""

  domains: tuple[tuple[str, float], ...]
  prompts_per_step: int
  holdout_per_domain: int
  math_generators: tuple[str, ...] = ()
  rg_config: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
  curriculum: str = "none"
  synthetic_length: int = 2
  forgetting_margin: float = 0.0
  forgetting_boost: float = 2.0
  cover_domains_first: bool = False
  code_repair_max_chars: int = 0
  extraction_tokens: tuple[int, int] = (2000, 100000)
  extraction_fields: tuple[int, int] = (4, 10)

  @property
  def weights(self) -> dict[str, float]:
    return dict(self.domains)

  def rg_fields(self, domain: str) -> tuple[tuple[str, Any], ...]:
    return dict(self.rg_config).get(domain, ())


@dataclasses.dataclass(frozen=True)
class OverlongShaping:
  """DAPO's soft overlong punishment (rlpt.algorithms.dapo.overlong_penalty): the last
  `buffer` tokens of the `max_len` budget ramp the reward down to -`penalty`; 0 = off."""

  buffer: int = 0
  penalty: float = 1.0
  max_len: int = 1


@dataclasses.dataclass(frozen=True)
class RLSettings:
  """config.rl: the algorithm, the optimizer and the batch-level choices."""

  algo: AlgoSpec
  optim: OptimConfig
  microbatch_size: int
  dynamic_sampling: bool
  max_refill_rounds: int
  oversample: float      # dynamic sampling: prompts drawn per round = ceil(oversample x missing)
  overlong: OverlongShaping
  length_multiple: int
  window_multiple: int
  share_prompts: bool
  max_staleness: int
  mode: str              # "sync" | "async"
  buffer_groups: int     # async: finished groups the buffer holds
  async_rounds: int      # async: generation rounds in flight
  inflight: str          # async: "finish" | "abort" | "continue" a request running across a
                         # weight update
  gate_keep: str = "all"  # async: the staleness gate's kept fraction, GATE_KEEP

  def collect_budget(self, prompts_per_step: int) -> int:
    """Groups one step may consume: with dynamic sampling the refill budget
    ceil((max_refill_rounds + 1) x prompts_per_step x oversample) (a step that has
    not kept prompts_per_step groups by then trains what it has), else
    prompts_per_step."""
    if not self.dynamic_sampling:
      return prompts_per_step
    return math.ceil((self.max_refill_rounds + 1) * prompts_per_step * self.oversample)


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything an RL run is configured with (see the module docstring)."""

  seed: int
  total_steps: int
  model: ModelSettings
  mesh: tuple[tuple[str, int], ...]
  rollout: RolloutSettings
  fleet: FleetSettings
  data: DataSettings
  rl: RLSettings
  rewards: RewardConfig
  sft: SFTConfig
  scheduler: SchedulerSettings
  eval_every: int
  eval_base_tasks: int   # per domain for the base model's evaluation; -1 = the whole holdout
  checkpoint_every: int
  checkpoint_keep: int
  eval_domains: int = 0  # domains per intermediate evaluation, in rotation; 0 = all
  eval_engine: str = "rollout"  # where holdouts are decoded: EVAL_ENGINES
  cpu_devices: int = 0   # host devices launch.train asked XLA for (0 = the platform's)
  episodes: EpisodeSettings = EpisodeSettings()  # how episodic domains are played

  def engine_config(self) -> JaxEngineConfig:
    """The rollout engine's settings: its context also holds a whole episode
    (episodes.max_context_tokens) when the run has episodic domains."""
    from rlpt.envs import registry as env_registry
    episodic = any(env_registry.is_episodic(d) for d, _ in self.data.domains)
    return self.rollout.engine_config(
        self.seed, self.episodes.caps.max_context_tokens if episodic else 0)

  @property
  def rows(self) -> int:
    """Learner rows of a full step: prompts_per_step x rollout.n."""
    return self.data.prompts_per_step * self.rollout.n

  def learner_rows(self, trained: int) -> int:
    """The rows a step that trains `trained` rows is padded to: the smallest of rows,
    rows / 2, rows / 4, ... that holds them in whole groups, whole microbatches and an
    equal share for each device of the mesh's batch axes. So a step whose dynamic
    sampling kept one group of four runs one group's sequence through the learner, not
    four of which three are padding (measured on SmolLM2 episodes: 24 s -> 7 s a step),
    and there are at most log2(prompts_per_step) + 1 row counts to compile."""
    from rlpt.models.sharding import LOGICAL_RULES
    n, mbs = self.rollout.n, self.rl.microbatch_size
    mesh = dict(self.mesh)
    devices = int(np.prod([mesh.get(a, 1) for a in LOGICAL_RULES["batch"]]))
    best, r = self.rows, self.rows
    while r % 2 == 0 and r // 2 >= max(trained, 1):
      r //= 2
      if r % (n * devices) == 0 and (r <= mbs or r % mbs == 0):
        best = r
    return best

  @classmethod
  def from_config(cls, config: Any) -> "Settings":
    """Checks `config` and reads it once (see the module docstring)."""
    get = _Reader(config)
    seed, total = int(get("seed")), int(get("total_steps"))
    _need(total >= 1, "total_steps", total, "an integer >= 1")
    model = _model(get)
    rollout = _rollout(get)
    fleet = _fleet(get)
    _need(rollout.engine != "fleet" or fleet.kind != "url" or rollout.temperature in (0.0, 1.0),
          "rollout.temperature", rollout.temperature,
          "1 (or 0) with fleet.kind = 'url': the learner needs each token's logprob under "
          "softmax(logits / temperature), which rlpt's own servers report and servers "
          "started elsewhere may not")
    _need(rollout.engine != "fleet" or fleet.kind != "url" or not rollout.max_wall_s,
          "rollout.max_wall_s", rollout.max_wall_s,
          "0 with fleet.kind = 'url': the per-sample wall cap is enforced by rlpt's own "
          "engine and servers (launch.serve); an SGLang server refuses the key")
    data = _data(get)
    rl = _rl(get, total, rollout, data.prompts_per_step)
    rewards = _rewards(get)
    sft = _sft(get)
    scheduler = _scheduler(get)
    episodes = _episodes(get)
    eval_every = int(get("eval.every"))
    _need(eval_every >= 0, "eval.every", eval_every, ">= 0 (0 = only at the end)")
    base_tasks = int(get("eval.base_tasks"))
    _need(base_tasks >= -1, "eval.base_tasks", base_tasks,
          ">= 0 tasks per domain, or -1 for the whole holdout")
    eval_domains = int(get("eval.domains_per_eval"))
    _need(eval_domains >= 0, "eval.domains_per_eval", eval_domains, ">= 0 (0 = every domain)")
    eval_engine = str(get("eval.engine"))
    _need(eval_engine in EVAL_ENGINES, "eval.engine", eval_engine, f"one of {EVAL_ENGINES}")
    cpu_devices = int(get("cpu_devices"))
    _need(cpu_devices >= 0, "cpu_devices", cpu_devices, ">= 0 (0 = the platform's devices)")
    every, keep = int(get("checkpoint.every")), int(get("checkpoint.keep"))
    _need(every >= 1, "checkpoint.every", every, ">= 1")
    _need(keep >= 1, "checkpoint.keep", keep, ">= 1")
    mesh = {a: int(v) for a, v in get("mesh").items()}
    bad = sorted(set(mesh) - set(MESH_AXES))
    _need(not bad, "mesh", mesh, f"axes among {MESH_AXES} (unknown: {bad})")
    size = int(np.prod(list(mesh.values())))
    _need(size <= len(jax.devices()), "mesh", mesh,
          f"axis sizes whose product ({size}) fits the {len(jax.devices())} visible devices")
    rows = data.prompts_per_step * rollout.n
    mbs = min(rl.microbatch_size, rows)
    _need(mbs >= 1 and rows % mbs == 0, "rl.microbatch_size", rl.microbatch_size,
          f"a divisor of prompts_per_step x rollout.n = {rows}")
    if rl.algo.advantage in ("group_norm", "group_mean", "rloo") or rl.dynamic_sampling:
      _need(rollout.n >= 2, "rollout.n", rollout.n,
            f">= 2 for group-relative advantages ({rl.algo.advantage})")
    _need(rl.overlong.buffer <= rollout.max_new_tokens, "rl.overlong_buffer", rl.overlong.buffer,
          f"<= rollout.max_new_tokens = {rollout.max_new_tokens}")
    unread = get.unread()
    if unread:
      raise ConfigError(f"config field(s) {unread} are read by nothing (misspelt, or left "
                        f"from an older schema); remove them or see configs/common.py")
    s = cls(seed=seed, total_steps=total, model=model, mesh=tuple(mesh.items()),
            rollout=rollout, fleet=fleet, data=data, rl=rl, rewards=rewards, sft=sft,
            scheduler=scheduler, eval_every=eval_every, eval_base_tasks=base_tasks, checkpoint_every=every, checkpoint_keep=keep,
            eval_domains=eval_domains, eval_engine=eval_engine, episodes=episodes, cpu_devices=cpu_devices)
    _check_domains(s)
    return s


def _model(get) -> ModelSettings:
  from rlpt.train import policy
  name = str(get("model.name"))
  why = policy.check_model_name(name)
  if why:
    raise ConfigError(why)
  tiny = get("model.tiny")
  unknown = sorted(set(tiny) - set(policy.TINY_DEFAULTS))
  _need(not unknown, "model.tiny", tiny, f"fields among {sorted(policy.TINY_DEFAULTS)}")
  ctx = int(get("model.context_length"))
  _need(ctx >= 0, "model.context_length", ctx, ">= 0 tokens (0 = the checkpoint's)")
  scaling = tuple(sorted(dict(get("model.rope_scaling")).items()))
  if scaling:
    from rlpt.models import decoder
    kind = dict(scaling).get("rope_type", dict(scaling).get("type"))
    _need(kind in decoder.ROPE_TYPES and kind != "default", "model.rope_scaling",
          dict(scaling), f"a rope_type among {[t for t in decoder.ROPE_TYPES if t != 'default']} "
          "with its fields (e.g. {'rope_type': 'linear', 'factor': 4.0})")
  return ModelSettings(name=name, dtype=str(get("model.dtype")), remat=bool(get("model.remat")),
                       tiny=tuple(sorted((k, int(v)) for k, v in tiny.items())),
                       context_length=ctx, rope_scaling=scaling)


def _rollout(get) -> RolloutSettings:
  r = RolloutSettings(
      engine=str(get("rollout.engine")), n=int(get("rollout.n")),
      max_new_tokens=int(get("rollout.max_new_tokens")),
      temperature=float(get("rollout.temperature")), top_p=float(get("rollout.top_p")),
      top_k=int(get("rollout.top_k")), kv_cache_mb=float(get("rollout.kv_cache_mb")),
      max_batch=int(get("rollout.max_batch")), max_prompt_len=int(get("rollout.max_prompt_len")),
      min_prompt_bucket=int(get("rollout.min_prompt_bucket")),
      length_multiple=int(get("rollout.length_multiple")),
      max_wall_s=float(get("rollout.max_wall_s")))
  _need(r.max_wall_s >= 0, "rollout.max_wall_s", r.max_wall_s,
        "seconds >= 0 (0 = no per-sample wall cap)")
  _need(r.engine in ENGINES, "rollout.engine", r.engine, f"one of {ENGINES}")
  _need(r.n >= 1, "rollout.n", r.n, "samples per prompt >= 1")
  _need(r.max_new_tokens >= 1, "rollout.max_new_tokens", r.max_new_tokens, ">= 1")
  _need(r.temperature >= 0, "rollout.temperature", r.temperature, ">= 0")
  _need(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "a value in (0, 1]")
  _need(r.top_k >= 0, "rollout.top_k", r.top_k, ">= 0 (0 = off)")
  _need(r.temperature in (0.0, 1.0) or (r.top_p == 1.0 and r.top_k == 0), "rollout.temperature",
        r.temperature, "1 (or 0) when rollout.top_p < 1 or rollout.top_k > 0: the learner "
        "trains softmax(logits / temperature), which a truncated sampler does not draw from")
  for f in ("max_batch", "max_prompt_len", "min_prompt_bucket", "length_multiple"):
    _need(getattr(r, f) >= 1, f"rollout.{f}", getattr(r, f), ">= 1")
  _need(r.kv_cache_mb > 0, "rollout.kv_cache_mb", r.kv_cache_mb, "> 0")
  return r


def _fleet(get) -> FleetSettings:
  f = FleetSettings(kind=str(get("fleet.kind")), members=int(get("fleet.members")),
                    urls=tuple(u.strip() for u in str(get("fleet.urls")).split(",") if u.strip()),
                    load_hf=bool(get("fleet.load_hf")),
                    startup_timeout_s=float(get("fleet.startup_timeout_s")),
                    ray_address=str(get("ray.address")),
                    placement=str(get("fleet.placement")))
  _need(f.kind in FLEET_KINDS, "fleet.kind", f.kind, f"one of {FLEET_KINDS}")
  _need(f.placement in ("auto", "none"), "fleet.placement", f.placement, "'auto' or 'none'")
  if f.kind == "server":
    _need(f.members >= 1, "fleet.members", f.members, ">= 1 server member")
  else:
    _need(bool(f.urls), "fleet.urls", ",".join(f.urls),
          "comma-separated server URLs for fleet.kind = 'url'")
  _need(f.startup_timeout_s > 0, "fleet.startup_timeout_s", f.startup_timeout_s, "> 0")
  return f


def _data(get) -> DataSettings:
  domains = get("data.domains")
  if not domains:
    raise ConfigError("config.data.domains is empty: expected {domain: weight, ...}")
  for d, w in domains.items():
    if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
      raise ConfigError(f"config.data.domains.{d} = {w!r}: expected a weight >= 0")
  rg = get("data.rg_config")
  gens = tuple(g.strip() for g in str(get("data.math_generators")).split(",") if g.strip())
  d = DataSettings(
      domains=tuple(sorted((k, float(v)) for k, v in domains.items())),
      prompts_per_step=int(get("data.prompts_per_step")),
      holdout_per_domain=int(get("data.holdout_per_domain")), math_generators=gens,
      rg_config=tuple(sorted((dom, tuple(sorted(dict(f).items()))) for dom, f in rg.items())),
      curriculum=str(get("data.curriculum")), synthetic_length=int(get("data.synthetic_length")),
      forgetting_margin=float(get("data.forgetting_margin")),
      forgetting_boost=float(get("data.forgetting_boost")),
      cover_domains_first=bool(get("data.cover_domains_first")),
      code_repair_max_chars=int(get("data.code_repair_max_chars")),
      extraction_tokens=tuple(int(x) for x in get("data.extraction_tokens")),
      extraction_fields=tuple(int(x) for x in get("data.extraction_fields")))
  for field in ("extraction_tokens", "extraction_fields"):
    v = getattr(d, field)
    _need(len(v) == 2 and 1 <= v[0] <= v[1], f"data.{field}", v, "(min, max) with 1 <= min <= max")
  _need(d.prompts_per_step >= 1, "data.prompts_per_step", d.prompts_per_step, ">= 1")
  _need(d.holdout_per_domain >= 0, "data.holdout_per_domain", d.holdout_per_domain, ">= 0")
  _need(d.synthetic_length >= 1, "data.synthetic_length", d.synthetic_length, ">= 1")
  _need(d.code_repair_max_chars >= 0, "data.code_repair_max_chars", d.code_repair_max_chars,
        ">= 0 (0 = every shipped mutant)")
  from rlpt.data.mixer import CURRICULA
  _need(d.curriculum in CURRICULA, "data.curriculum", d.curriculum, f"one of {CURRICULA}")
  _need(0.0 <= d.forgetting_margin < 1.0, "data.forgetting_margin", d.forgetting_margin,
        "a fraction in [0, 1) (0 = no forgetting guard)")
  _need(d.forgetting_boost >= 1.0, "data.forgetting_boost", d.forgetting_boost, ">= 1")
  return d


def _rl(get, total_steps: int, rollout: RolloutSettings, prompts_per_step: int) -> RLSettings:
  # AlgoSpec.temperature is rollout.temperature (the learner trains the distribution
  # that samples; greedy rollouts train the policy itself), not a config.rl field
  raw = {f.name: get(f"rl.{f.name}") for f in dataclasses.fields(AlgoSpec)
         if f.name != "temperature"}
  try:
    algo = AlgoSpec.from_config(raw, max_new_tokens=rollout.max_new_tokens)
    algo = dataclasses.replace(algo, temperature=rollout.temperature or 1.0)
    optim = OptimConfig(
        lr=float(get("rl.lr")), schedule=str(get("rl.lr_schedule")),
        warmup_steps=int(get("rl.warmup_steps")), total_steps=total_steps,
        weight_decay=float(get("rl.weight_decay")), b1=float(get("rl.adam_b1")),
        b2=float(get("rl.adam_b2")), eps=float(get("rl.adam_eps")),
        max_grad_norm=float(get("rl.max_grad_norm")))
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e)) from e
  rl = RLSettings(
      algo=algo, optim=optim, microbatch_size=int(get("rl.microbatch_size")),
      dynamic_sampling=bool(get("rl.dynamic_sampling")),
      max_refill_rounds=int(get("rl.max_refill_rounds")),
      oversample=float(get("rl.dynamic_sampling_oversample")),
      overlong=OverlongShaping(buffer=int(get("rl.overlong_buffer")),
                               penalty=float(get("rl.overlong_penalty")),
                               max_len=rollout.max_new_tokens),
      length_multiple=int(get("rl.length_multiple")), share_prompts=bool(get("rl.share_prompts")),
      window_multiple=int(get("rl.window_multiple")),
      max_staleness=int(get("rl.max_staleness")), mode=str(get("rl.mode")),
      buffer_groups=int(get("rl.buffer_groups")) or 2 * prompts_per_step,
      async_rounds=int(get("rl.async_rounds")), inflight=str(get("rl.inflight")),
      gate_keep=str(get("rl.gate_keep")))
  _need(rl.microbatch_size >= 1, "rl.microbatch_size", rl.microbatch_size, ">= 1")
  _need(rl.max_refill_rounds >= 0, "rl.max_refill_rounds", rl.max_refill_rounds, ">= 0")
  _need(1.0 <= rl.oversample <= 16.0, "rl.dynamic_sampling_oversample", rl.oversample,
        "between 1 and 16 (prompts drawn per missing group)")
  _need(rl.overlong.buffer >= 0, "rl.overlong_buffer", rl.overlong.buffer, ">= 0 (0 = off)")
  _need(rl.length_multiple >= 1, "rl.length_multiple", rl.length_multiple, ">= 1")
  _need(rl.window_multiple >= 1, "rl.window_multiple", rl.window_multiple, ">= 1")
  _need(rl.max_staleness >= 0, "rl.max_staleness", rl.max_staleness, ">= 0")
  _need(rl.mode in RL_MODES, "rl.mode", rl.mode, f"one of {RL_MODES}")
  _need(rl.inflight in INFLIGHT, "rl.inflight", rl.inflight, f"one of {INFLIGHT}")
  _need(rl.gate_keep in GATE_KEEP, "rl.gate_keep", rl.gate_keep, f"one of {GATE_KEEP}")
  if rl.mode == "async":  # what cannot be overlapped is refused here, not discovered later
    _need(rollout.engine == "fleet", "rl.mode", rl.mode,
          "'sync' with rollout.engine = 'jax' (the embedded engine shares the learner's "
          "process and devices, so generation cannot overlap training); use "
          "rollout.engine = 'fleet' for async")
    _need(rl.max_staleness >= 1, "rl.max_staleness", rl.max_staleness,
          ">= 1 with rl.mode = 'async' (at 0 every rollout generated during an update "
          "would be stale)")
    _need(rl.buffer_groups >= prompts_per_step, "rl.buffer_groups", rl.buffer_groups,
          f">= data.prompts_per_step = {prompts_per_step} (the buffer must hold one batch)")
    _need(rl.async_rounds >= 1, "rl.async_rounds", rl.async_rounds, ">= 1")
  return rl


def _rewards(get) -> RewardConfig:
  pen = dict(RewardConfig().penalties)
  pen.update({k: float(v) for k, v in get("rewards.penalties").items()})
  timeout = float(get("rewards.timeout_s"))
  _need(timeout > 0, "rewards.timeout_s", timeout, "> 0 seconds")
  return RewardConfig(penalties=pen, timeout_s=timeout)


def _scheduler(get) -> SchedulerSettings:
  sc = SchedulerSettings(max_attempts=int(get("scheduler.max_attempts")),
                         backoff_s=float(get("scheduler.backoff_s")),
                         check_references=bool(get("scheduler.check_references")))
  _need(sc.max_attempts >= 1, "scheduler.max_attempts", sc.max_attempts,
        ">= 1 attempt per stage")
  _need(sc.backoff_s >= 0, "scheduler.backoff_s", sc.backoff_s, ">= 0 seconds")
  return sc


def _episodes(get) -> EpisodeSettings:
  from rlpt.envs.episode import EpisodeCaps
  from rlpt.envs.sandbox_tools import ToolLimits
  e = {k: get(f"episodes.{k}") for k in ("max_turns", "max_context_tokens", "max_tool_s",
                                         "truncated_reward", "max_calls", "run_timeout_s",
                                         "with_tools", "kv_reuse")}
  for k in ("max_turns", "max_context_tokens", "max_calls"):
    _need(isinstance(e[k], int) and not isinstance(e[k], bool) and e[k] >= 1, f"episodes.{k}",
          e[k], "an integer >= 1")
  for k in ("max_tool_s", "run_timeout_s"):
    _need(isinstance(e[k], (int, float)) and not isinstance(e[k], bool) and e[k] > 0,
          f"episodes.{k}", e[k], "> 0 seconds")
  for k in ("with_tools", "kv_reuse"):
    _need(isinstance(e[k], bool), f"episodes.{k}", e[k], "True or False")
  try:
    caps = EpisodeCaps(max_turns=e["max_turns"], max_context_tokens=e["max_context_tokens"],
                       max_tool_s=float(e["max_tool_s"]), truncated_reward=e["truncated_reward"])
  except ValueError as err:
    raise ConfigError(f"config.episodes: {err}") from err
  tools = ToolLimits(run_timeout_s=float(e["run_timeout_s"]), max_calls=e["max_calls"],
                     max_tool_s=float(e["max_tool_s"]))
  return EpisodeSettings(caps=caps, tools=tools, with_tools=e["with_tools"],
                         kv_reuse=None if e["kv_reuse"] else False)


def _sft(get) -> SFTConfig:
  try:
    return SFTConfig(steps=int(get("sft.steps")), batch_size=int(get("sft.batch_size")),
                     lr=float(get("sft.lr")), max_len=int(get("sft.max_len")),
                     warmup_steps=int(get("sft.warmup_steps")),
                     length_multiple=int(get("sft.length_multiple")))
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _check_domains(s: Settings) -> None:
  """Every domain has a verifier and a task source that can draw a task."""
  from rlpt import rewards
  from rlpt.train import build
  for d, _ in s.data.domains:
    if not rewards.has_verifier(d):
      close = difflib.get_close_matches(d, list(rewards.VERIFIER_REGISTRY), n=3)
      raise ConfigError(f"config.data.domains: no verifier registered for domain {d!r}"
                        + (f"; did you mean {close}?" if close else ""))
    build.task_source(d, s.data, seed=s.seed)  # ConfigError if none


def check_config(config: Any) -> Settings:
  """`Settings.from_config(config)`: the config checks every launcher runs first."""
  return Settings.from_config(config)
