"""The rollout fleet of `rollout.engine = "fleet"`: its members, and the weight sync that
feeds them published Orbax versions.

    fleet = start_fleet(settings, model, tokenizer, workdir)   # a RolloutEngine
    sync = weight_sync(parts, workdir)                         # publish vN, fleet loads vN

Server members (`fleet.kind = "server"`) are `fleet.members` rollout server processes
(`rlpt.rollout.server_main`, the server launch.serve runs), each owned by a Ray actor
on this machine. They start from WORKDIR/weights/base.hf, the policy as the run
begins written as a HF checkpoint (architecture, tokenizer, weights), and from then
on load every version the learner publishes (WORKDIR/weights/vN, Orbax). URL members
(`fleet.kind = "url"`) are servers started elsewhere, e.g. SGLang on GPUs; with
`fleet.load_hf` each version is also published as a HF checkpoint (vN.hf) for them.
Every member uses the run's engine sizes (`rollout.*`), like the embedded engine.
"""

from __future__ import annotations

import os
from typing import Any

from rlpt.train.settings import Settings

BASE_DIR = "base.hf"


def _round_samples(settings: Settings) -> int:
  """One RL round's samples (prompts_per_step x n): a member's batch and the fleet's
  routing unit."""
  return max(settings.data.prompts_per_step, 1) * max(settings.rollout.n, 1)


def member_specs(settings: Settings, base_model: str, log_dir: str | None = None,
                 compile_cache: str | None = None) -> list[Any]:
  """One member spec per fleet member of `settings` (servers serve `base_model`).
  Server members share a persistent JAX compilation cache: the caller's
  JAX_COMPILATION_CACHE_DIR where it has one, else `compile_cache` (start_fleet:
  WORKDIR/jax_cache), so a program one member compiled is loaded by the others
  when they reach the same shape."""
  from rlpt.rollout.fleet_members import ServerSpec, UrlSpec
  from rlpt.rollout.server_main import ServeSettings
  f = settings.fleet
  if f.kind == "url":
    return [UrlSpec(u, load_hf=f.load_hf, startup_timeout_s=f.startup_timeout_s) for u in f.urls]
  # A batch holds one round's samples (prompts_per_step x n): an RL round's groups of
  # n, or as many n=1 holdout prompts (a prompt cap of prompts_per_step gave the
  # holdout 12-prompt batches on 64 decode slots).
  round_samples = _round_samples(settings)
  serve = ServeSettings(model=base_model, dtype=settings.model.dtype,
                        engine=settings.engine_config(),
                        default_max_new_tokens=settings.rollout.max_new_tokens,
                        max_batch_prompts=round_samples, max_batch_samples=round_samples,
                        warmup=False, seed=settings.seed)
  # One CPU device per member process, whatever the trainer's XLA flags say.
  env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu") or "cpu", "XLA_FLAGS": ""}
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    env["JAX_COMPILATION_CACHE_DIR"] = os.environ["JAX_COMPILATION_CACHE_DIR"]
  elif compile_cache:
    env["JAX_COMPILATION_CACHE_DIR"] = compile_cache
  if "JAX_COMPILATION_CACHE_DIR" in env:  # programs under a second are compiled again
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = os.environ.get(
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
  return [ServerSpec(serve, env=tuple(env.items()), startup_timeout_s=f.startup_timeout_s,
                     log_dir=log_dir)] * f.members


def start_fleet(settings: Settings, model: Any, tokenizer: Any, workdir: Any):
  """Writes the base checkpoint the server members load, then starts the fleet (each
  member healthy, or FleetError naming the member and its log)."""
  from rlpt.models.hf_checkpoint import save_hf
  from rlpt.rollout.fleet import Fleet
  base = os.path.join(workdir.weights, BASE_DIR)
  if settings.fleet.kind == "server":
    tmp = base + ".tmp"
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf(model, tokenizer, tmp)
    shutil.rmtree(base, ignore_errors=True)
    os.replace(tmp, base)
  log_dir = os.path.join(workdir.root, "fleet_logs")
  os.makedirs(log_dir, exist_ok=True)
  return Fleet(member_specs(settings, base, log_dir, os.path.join(workdir.root, "jax_cache")),
               ray_address=settings.fleet.ray_address or None,
               num_cpus=max(2, os.cpu_count() or 2), tokenizer=tokenizer, health_interval_s=2.0,
               placement=settings.fleet.placement,
               batch_samples=_round_samples(settings))


def weight_sync(parts: Any, workdir: Any):
  """WeightSync that publishes each version under WORKDIR/weights and has every fleet
  member load it."""
  from flax import nnx
  from rlpt.train.publish import WeightPublisher
  from rlpt.train.weight_sync import WeightSync
  s = parts.settings
  hf = s.fleet.kind == "url" and s.fleet.load_hf
  graphdef = nnx.graphdef(parts.model)
  return WeightSync(parts.engine, publisher=WeightPublisher(workdir.weights, keep=2, hf=hf),
                    to_model=lambda params: nnx.merge(graphdef, params), tokenizer=parts.tokenizer,
                    inflight=s.rl.inflight if s.rl.mode == "async" else "finish")
