"""Several processes, one global mesh: `jax.distributed` for the trainer.

    distributed.initialize(coordinator_address="10.0.0.1:1234", num_processes=2,
                           process_id=0)       # before anything touches a device
    mesh = make_mesh(data=2, fsdp=2)           # over every process's devices
    x = distributed.global_array(host_batch, NamedSharding(mesh, P(("data", "fsdp"))))

One process per host (a TPU pod, GPU nodes), or several CPU processes on one machine
(tests: 2 processes x 2 fake devices). Every process runs the same program on the
same config; arrays are global, each process holding the shards of its own devices.
`initialize` takes the coordinator from its arguments (launch.train's
--coordinator_address / --num_processes / --process_id), else from the environment
JAX reads itself (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID; SLURM and
Cloud TPU are detected by JAX), else it is a no-op (one process). On CPU the
cross-process collectives are gloo's.

Failure is bounded: a coordinator that cannot be reached fails after `timeout_s`
naming it; a process that dies mid-run is noticed by the others through the
coordination service's heartbeat (`heartbeat_s`), which ends them with an error
instead of a hang in a collective.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from typing import Any

import jax
import numpy as np

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


class DistributedError(RuntimeError):
  """A multi-process setup that cannot work: the message names the flag or field."""


def _check_address(address: str) -> None:
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit():
    raise DistributedError(f"--coordinator_address={address!r}: expected HOST:PORT")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout_s: int = 60,
               heartbeat_s: int = 10) -> bool:
  """Joins the job's processes; returns True when running multi-process.

  Must run before anything touches a device (the backend is then built over every
  process's devices). Arguments left None come from the JAX_* environment variables;
  with neither, a single-process run returns False without doing anything.
  """
  env = {k: os.environ.get(k) for k in ENV}
  address = coordinator_address or env["JAX_COORDINATOR_ADDRESS"]
  n = num_processes if num_processes is not None else (
      int(env["JAX_NUM_PROCESSES"]) if env["JAX_NUM_PROCESSES"] else None)
  pid = process_id if process_id is not None else (
      int(env["JAX_PROCESS_ID"]) if env["JAX_PROCESS_ID"] else None)
  if address is None and n in (None, 1):
    return False
  if address is None:
    raise DistributedError(f"--num_processes={n} needs --coordinator_address=HOST:PORT "
                           "(or JAX_COORDINATOR_ADDRESS)")
  _check_address(address)
  if n is None or n < 1:
    raise DistributedError(f"--num_processes={n}: expected the number of processes (>= 1)")
  if pid is None or not 0 <= pid < n:
    raise DistributedError(f"--process_id={pid}: expected 0 <= process_id < num_processes={n}")
  from jax._src import xla_bridge
  if xla_bridge.backends_are_initialized():
    raise DistributedError("distributed.initialize must run before anything uses a device "
                           "(jax.devices(), an array, a jit call)")
  if pid != 0:  # process 0 serves the coordinator; the others must reach it
    _wait_for_coordinator(address, pid, n, timeout_s)
  if (os.environ.get("JAX_PLATFORMS") or "cpu").split(",")[0] == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(address, num_processes=n, process_id=pid,
                               initialization_timeout=int(timeout_s),
                               heartbeat_timeout_seconds=int(heartbeat_s))
  except Exception as e:  # noqa: BLE001 -- JAX raises several types for the same failure
    raise DistributedError(
        f"process {pid} of {n} could not join the coordinator at {address} within "
        f"{timeout_s} s (--coordinator_address): {type(e).__name__}: {str(e)[:300]}") from e
  return True


def _wait_for_coordinator(address: str, pid: int, n: int, timeout_s: float) -> None:
  """Retries a TCP connection to the coordinator until `timeout_s`; JAX itself ends the
  process with a fatal log (no exception) when it cannot join, so the clear error
  has to come first."""
  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout_s
  last = None
  while time.monotonic() < deadline:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
        return
    except OSError as e:
      last = e
      time.sleep(0.5)
  raise DistributedError(
      f"process {pid} of {n} could not join the coordinator at {address} within "
      f"{timeout_s} s (--coordinator_address; is process 0 running?): {last}")


def is_primary() -> bool:
  """True in the process that writes metrics, trajectories and logs (process 0)."""
  return jax.process_index() == 0


def global_array(host: np.ndarray, sharding) -> jax.Array:
  """A global array from a host array every process holds in full: each process puts
  only the shards of its own devices (one process: the same as device_put)."""
  from rlpt.models.sharding import place   # the same per-device placement
  return place(np.asarray(host), sharding)


def host_value(x) -> np.ndarray:
  """The whole value of a (possibly multi-process) array on this host."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def config_digest(config: Any) -> str:
  """A short hash of a config (its JSON form)."""
  text = config.to_json_best_effort(sort_keys=True) if hasattr(config, "to_json_best_effort") \
      else json.dumps(config, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_same_config(config: Any) -> None:
  """Raises DistributedError naming the processes whose config differs from process 0's."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  digest = np.frombuffer(bytes.fromhex(config_digest(config)), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(digest))   # [processes, 8]
  differ = [i for i in range(every.shape[0]) if not np.array_equal(every[i], every[0])]
  if differ:
    raise DistributedError(f"processes {differ} were started with a config that differs from "
                           "process 0's (every process must get the same --config and flags)")


def check_mesh(sizes: dict[str, int]) -> None:
  """Raises DistributedError when the mesh does not cover the job's devices evenly."""
  n = int(np.prod(list(sizes.values()))) if sizes else 1
  total, procs = jax.device_count(), jax.process_count()
  if procs > 1 and n != total:
    raise DistributedError(f"config.mesh {sizes} has {n} devices; the {procs} processes have "
                           f"{total} (set the mesh axes so their product is {total})")
  if n % procs:
    raise DistributedError(f"config.mesh {sizes}: {n} devices do not divide over "
                           f"--num_processes={procs}")


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's `obj` (picklable), in process order; a collective every process
  must call. One process: [obj]."""
  if jax.process_count() == 1:
    return [obj]
  import pickle
  from jax.experimental import multihost_utils
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  every = np.asarray(multihost_utils.process_allgather(padded))   # [processes, max bytes]
  return [pickle.loads(every[i, :int(sizes.reshape(-1)[i])].tobytes())
          for i in range(every.shape[0])]


def shard_bounds(count: int, process: int | None = None,
                 processes: int | None = None) -> tuple[int, int]:
  """[lo, hi) of `count` items that `process` (default: this one) handles: contiguous
  blocks, the first `count % processes` one item longer."""
  p = jax.process_index() if process is None else process
  n = jax.process_count() if processes is None else processes
  per, extra = divmod(count, n)
  lo = p * per + min(p, extra)
  return lo, lo + per + (1 if p < extra else 0)


def barrier(name: str) -> None:
  """Waits until every process reaches `name` (no-op in one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
