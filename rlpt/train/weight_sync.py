"""Weight sync: the third stage of an RL step, from the learner's new parameters to an
engine serving them under a version.

    sync = WeightSync(engine)                          # embedded JaxEngine: in process
    sync = WeightSync(fleet, publisher=publisher)      # Fleet: through Orbax checkpoints
    seconds = sync.sync(learner.state.params, version=step)

In process, the parameters are `device_put` into the engine's own shardings
(`JaxEngine.update_weights(params, version)`). Published, `WeightPublisher.publish`
writes version N as an Orbax checkpoint (WORKDIR/weights/vN, plus its HF export when
the publisher was made with hf=True, for servers that load HF checkpoints) and the
engine loads it from there (`Fleet.update_weights(path, N)`: every member restores
it and acknowledges N); versions older than the newest `keep` are then deleted.

In async mode the loop calls `sync(params, N, wait=False)`: it copies the parameters
to host memory and returns; a background thread publishes vN and has the fleet load
it (members load between generation batches, so a load can take as long as a batch),
in version order, while the learner trains on. It waits only when `max_behind`
versions are still unloaded; `wait()` (before an evaluation, at the end) finishes them.

The version rules live here and nowhere else: versions only move forward (the same
version again is allowed: the first sync after SFT or a resume), and after a sync the
engine must report the version it was given.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from typing import Any

import jax
import numpy as np

from rlpt.rollout.engine import RolloutEngine
from rlpt.train.publish import WeightPublisher, hf_path, published_versions, version_path


class WeightSyncError(RuntimeError):
  """The engine did not end up serving the version it was sent."""


def param_dict(params: Any) -> Any:
  """The nested dict of arrays (`Decoder.arrays()` layout) of a Decoder, an nnx.State
  or such a dict: what engines load and the publisher writes."""
  arrays = getattr(params, "arrays", None)
  if callable(arrays):
    return arrays()
  to_pure = getattr(params, "to_pure_dict", None)
  return to_pure() if callable(to_pure) else params


class WeightSync:
  """Moves parameters into `engine` under a version; see the module docstring.

  Args:
    engine: any RolloutEngine (a JaxEngine, or a Fleet).
    publisher: write versions with it and have the engine load them from disk (a
      Fleet, whose members live in other processes); None = hand the arrays over in
      process.
    to_model: params -> Decoder, needed when the publisher writes HF exports.
    tokenizer: written beside each HF export.
    inflight: what a published sync does to the engine's requests in flight: "finish"
      (on the version they started with), "abort" (and rerun on the new version,
      `Fleet.update_weights(..., abort_inflight=True)`) or "continue" (under the new
      version from the next decode chunk on: partial rollouts, each token tagged with
      the version that sampled it, `continue_inflight=True`).
    max_behind: staged syncs (`sync(wait=False)`) that may be unfinished at once.
  """

  def __init__(self, engine: RolloutEngine, *, publisher: WeightPublisher | None = None,
               to_model=None, tokenizer: Any = None, inflight: str = "finish",
               max_behind: int = 2):
    self.engine = engine
    self.publisher = publisher
    self.to_model = to_model
    self.tokenizer = tokenizer
    if inflight not in ("finish", "abort", "continue"):
      raise ValueError(f"WeightSync: inflight must be 'finish', 'abort' or 'continue', "
                       f"got {inflight!r}")
    self.inflight = inflight
    self.max_behind = int(max_behind)
    self.last_seconds = 0.0
    self.last_load_seconds = 0.0   # publish + load of the last background sync
    self._staged: collections.deque = collections.deque()   # (version, Future) in order
    self._worker: concurrent.futures.ThreadPoolExecutor | None = None

  @property
  def version(self) -> int:
    return int(self.engine.weight_version)

  def _source(self, params: Any) -> Any:
    if self.publisher is not None and self.publisher.hf:  # the HF export needs a Decoder
      return params if hasattr(params, "config") else self.to_model(params)
    return param_dict(params)

  def _publish_and_load(self, source: Any, version: int) -> float:
    t0 = time.perf_counter()
    info = self.publisher.publish(source, version, tokenizer=self.tokenizer)
    if self.inflight == "abort":
      self.engine.update_weights(info.path, version, abort_inflight=True)
    elif self.inflight == "continue":
      self.engine.update_weights(info.path, version, continue_inflight=True)
    else:
      self.engine.update_weights(info.path, version)
    self._check(version)
    self.publisher.gc(in_use=[version])  # later staged versions are not on disk yet
    return time.perf_counter() - t0

  def sync(self, params: Any, version: int, *, wait: bool = True) -> float:
    """Makes the engine serve `params` as `version`; returns the wall seconds.

    `wait=False` (published syncs, the async loop) stages the sync: the parameters are
    copied to host memory here (so the learner may donate them right after) and a
    background thread publishes them and has the engine load them, in version order,
    while the learner goes on; `sync` waits only when more than `max_behind` staged
    versions are not loaded yet. `wait()` finishes every staged sync."""
    version = int(version)
    if version < self.version or any(version < v for v, _ in self._staged):
      raise ValueError(f"weight sync to version {version}, but the engine already serves "
                       f"version {self.version}: versions only move forward")
    t0 = time.perf_counter()
    if self.publisher is not None and not wait:
      while len(self._staged) >= self.max_behind:
        self._finish_oldest()
      # a host copy the learner's next (donating) update cannot touch: on CPU,
      # device_get may hand back views of the device buffers themselves
      source = self._source(jax.tree.map(lambda x: np.array(x, copy=True),
                                         jax.device_get(params)))
      if self._worker is None:
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlpt-sync")
      self._staged.append((version, self._worker.submit(self._publish_and_load, source,
                                                        version)))
      self.last_seconds = time.perf_counter() - t0
      return self.last_seconds
    self.wait()
    if self.publisher is None:
      if jax.process_count() > 1:   # global arrays: every process's engine gets them whole
        from rlpt.train import distributed
        params = jax.tree.map(distributed.host_value, param_dict(params))
      self.engine.update_weights(params, version)
      self._check(version)
    else:
      self._publish_and_load(self._source(params), version)
    self.last_seconds = time.perf_counter() - t0
    return self.last_seconds

  def _finish_oldest(self) -> None:
    version, future = self._staged[0]
    try:
      self.last_load_seconds = future.result()
    finally:
      self._staged.popleft()

  def wait(self) -> float:
    """Finishes every staged sync (raising what one raised: the engine keeps its
    previous version); returns the seconds waited (0 when none)."""
    t0 = time.perf_counter()
    while self._staged:
      self._finish_oldest()
    return time.perf_counter() - t0

  def _check(self, version: int) -> None:
    if self.version != version:
      raise WeightSyncError(f"engine reports weight version {self.version} after a sync "
                            f"to version {version}")

  def restart(self, params: Any, version: int) -> float:
    """The first sync of a run that starts (or resumes) at `version`: versions a
    crashed run published at or past it are deleted first (they would be published
    again from the restored state), then `sync`."""
    if self.publisher is not None:
      import shutil
      for v in published_versions(self.publisher.root):
        if v >= version:
          shutil.rmtree(version_path(self.publisher.root, v), ignore_errors=True)
          shutil.rmtree(hf_path(self.publisher.root, v), ignore_errors=True)
    return self.sync(params, version)
