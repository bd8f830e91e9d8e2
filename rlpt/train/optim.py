"""The learner's optimizer: Optax AdamW behind global-norm clipping, with a schedule.

    tx = make_optimizer(OptimConfig.from_config(config))

Learning rate: linear warmup from 0 over `warmup_steps`, then constant, cosine decay
to `end_lr_ratio * lr`, or linear decay to it, by `total_steps`. Weight decay skips
norm scales (any parameter whose path mentions "norm") and biases.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """Optimizer hyper-parameters (config.rl.* and config.total_steps)."""

  lr: float = 1e-6
  schedule: str = "constant"
  warmup_steps: int = 0
  total_steps: int = 100
  end_lr_ratio: float = 0.0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  max_grad_norm: float = 1.0          # <= 0: no clipping

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"config.rl.lr_schedule = {self.schedule!r}: expected one of {SCHEDULES}")
    if self.lr <= 0:
      raise ValueError(f"config.rl.lr = {self.lr}: expected a positive learning rate")
    if self.warmup_steps < 0 or self.total_steps < 1:
      raise ValueError(f"warmup_steps={self.warmup_steps}, total_steps={self.total_steps}: "
                       "expected warmup_steps >= 0 and total_steps >= 1")

  @classmethod
  def from_config(cls, config: Any) -> "OptimConfig":
    rl = config.rl
    return cls(lr=float(rl.lr), schedule=str(rl.get("lr_schedule", "constant")),
               warmup_steps=int(rl.warmup_steps), total_steps=int(config.total_steps),
               weight_decay=float(rl.weight_decay), b1=float(rl.get("adam_b1", 0.9)),
               b2=float(rl.get("adam_b2", 0.999)), eps=float(rl.get("adam_eps", 1e-8)),
               max_grad_norm=float(rl.max_grad_norm))


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
  """step -> learning rate (see the module docstring)."""
  decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
  end = cfg.lr * cfg.end_lr_ratio
  if cfg.schedule == "constant":
    main = optax.constant_schedule(cfg.lr)
  elif cfg.schedule == "cosine":
    main = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=cfg.end_lr_ratio)
  else:
    main = optax.linear_schedule(cfg.lr, end, decay_steps)
  if cfg.warmup_steps == 0:
    return main
  warm = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
  return optax.join_schedules([warm, main], [cfg.warmup_steps])


def decay_mask(params):
  """True for parameters weight decay applies to (not norms, not biases)."""
  def keep(path, _):
    names = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path).lower()
    return "norm" not in names and not ({"bq", "bk", "bv", "bias"} & set(names.split("/")))
  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) then AdamW(schedule)."""
  adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=cfg.weight_decay, mask=decay_mask)
  if cfg.max_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
  return adamw


def init_state(tx: optax.GradientTransformation, params: Any, *, rest: Any) -> Any:
  """`tx.init(params)` with every per-parameter leaf (Adam's moments) in its
  parameter's sharding and the others (counters) in the Sharding `rest`, created in
  place by one jit. A bare `jax.jit(tx.init)` puts the moments whole on one device
  (zeros carry no sharding from their parameter), and replicating them over a mesh
  then holds a full copy per device: 8.6 GB of SmolLM2 moments on 8 host devices.
  Parameters that are not all on `rest`'s devices (a model trained where it was
  created) get the plain `jax.jit(tx.init)`."""
  placed = [p.sharding.device_set for p in jax.tree.leaves(params) if hasattr(p, "sharding")]
  if not placed or any(d != rest.device_set for d in placed):
    # parameters not (all) on rest's devices, e.g. a model SFT trains where it was
    # created: the moments stay where jit puts them, beside their parameters
    return jax.jit(tx.init)(params)
  abstract = jax.eval_shape(tx.init, params)
  shardings = optax.tree_map_params(
      tx, lambda _, p: getattr(p, "sharding", rest), abstract, params,
      transform_non_params=lambda _: rest)
  return jax.jit(tx.init, out_shardings=shardings)(params)
