"""Logical-axis sharding: one rules table from the model's axis names to mesh axes.

Model code names the axes of every array logically ("batch", "embed", "heads",
"kv", "mlp", "vocab", "length", "layers"); `LOGICAL_RULES` maps each name to mesh
axes of a `("data", "fsdp", "tensor", "seq")` mesh. A mesh axis is dropped from a
dimension it does not divide (e.g. SmolLM2's 9 heads on tensor=2 stay replicated)
and is used at most once per array, so every rule is safe on every mesh.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "seq")

# logical axis -> mesh axes it is split over (in order); absent or () = replicated.
LOGICAL_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "length": ("seq",),
    # Parameters (and so gradients and optimizer state) are also split over "seq": a
    # context-parallel group holds one copy of the model between its members, not one
    # each (ZeRO over the ring; on 8 host devices with seq=8, 2.2 GB of SmolLM2 weights,
    # gradients and Adam state instead of 17 GB). Each layer's weights are gathered for
    # its matmuls, as over "fsdp".
    "embed": ("fsdp", "seq"),
    "heads": ("tensor",),
    "mlp": ("tensor",),
    "vocab": ("tensor",),
    "kv": (),
    "layers": (),
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, seq: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ("data", "fsdp", "tensor", "seq") mesh over the first data*fsdp*tensor*seq devices."""
  shape = (data, fsdp, tensor, seq)
  n = int(np.prod(shape))
  devices = list(jax.devices() if devices is None else devices)
  if n > len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {n} devices, "
                     f"only {len(devices)} available")
  return Mesh(np.asarray(devices[:n]).reshape(shape), MESH_AXES)


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: dict[str, tuple[str, ...]] | None = None) -> PartitionSpec:
  """The PartitionSpec of an array with these logical axes and shape on `mesh`."""
  rules = LOGICAL_RULES if rules is None else rules
  used: set[str] = set()
  spec: list[Any] = []
  for name, dim in zip(logical_axes, shape):
    axes = []
    size = 1
    for ax in (rules.get(name, ()) if name is not None else ()):
      n = mesh.shape.get(ax, 1)
      if ax in used or n == 1 or dim % (size * n):
        continue
      axes.append(ax)
      size *= n
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  return PartitionSpec(*spec)


def logical_sharding(logical_axes, shape, mesh: Mesh, rules=None) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical_axes, shape, mesh, rules))


def param_shardings(config, mesh: Mesh, rules=None) -> dict[str, NamedSharding]:
  """Flat parameter path ("layers.wq", ...) -> its NamedSharding on `mesh`."""
  from rlpt.models.decoder import param_specs
  return {path: logical_sharding(axes, shape, mesh, rules)
          for path, (shape, axes, _) in param_specs(config).items()}


def state_shardings(state, mesh: Mesh, rules=None) -> Any:
  """A NamedSharding per variable of an nnx.State (e.g. the learner's parameters),
  from each variable's `logical_axes` metadata and the rules table."""
  from flax import nnx

  def one(var):
    shape = var.get_value().shape   # an array, or a ShapeDtypeStruct (nnx.eval_shape)
    axes = getattr(var, "logical_axes", None) or (None,) * len(shape)
    return logical_sharding(axes, shape, mesh, rules)
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def model_shardings(model) -> Any:
  """The NamedShardings of a model's parameters as an nnx.State (for jit out_shardings)."""
  from flax import nnx
  return jax.tree.map(lambda a: a.sharding, nnx.state(model, nnx.Param))


def cache_shardings(config, batch: int, max_len: int, mesh: Mesh, rules=None):
  """KVCache of NamedShardings: batch over data/fsdp, KV heads over tensor, slots over seq."""
  from rlpt.models.decoder import KVCache
  kv_shape = (batch, config.num_kv_heads, max_len, config.head_dim)
  kv = logical_sharding(("batch", "heads", "length", "kv"), kv_shape, mesh, rules)
  layers = (kv,) * config.num_layers
  return KVCache(k=layers, v=layers,
                 valid=logical_sharding(("batch", "length"), (batch, max_len), mesh, rules),
                 index=logical_sharding(("batch",), (batch,), mesh, rules))


def place(host: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """Puts a host array into `sharding`, each device receiving only its own shard."""
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
