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

The version rules live here and nowhere else: versions only move forward (the same
version again is allowed: the first sync after SFT or a resume), and after a sync the
engine must report the version it was given.
"""

from __future__ import annotations

import time
from typing import Any

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
    abort_inflight: published syncs abort the engine's requests in flight and rerun them
      on the new version (`Fleet.update_weights(..., abort_inflight=True)`); False lets
      them finish on the version they started with.
  """

  def __init__(self, engine: RolloutEngine, *, publisher: WeightPublisher | None = None,
               to_model=None, tokenizer: Any = None, abort_inflight: bool = False):
    self.engine = engine
    self.publisher = publisher
    self.to_model = to_model
    self.tokenizer = tokenizer
    self.abort_inflight = bool(abort_inflight)
    self.last_seconds = 0.0

  @property
  def version(self) -> int:
    return int(self.engine.weight_version)

  def sync(self, params: Any, version: int) -> float:
    """Makes the engine serve `params` as `version`; returns the wall seconds."""
    version = int(version)
    if version < self.version:
      raise ValueError(f"weight sync to version {version}, but the engine already serves "
                       f"version {self.version}: versions only move forward")
    t0 = time.perf_counter()
    if self.publisher is None:
      self.engine.update_weights(params, version)
    else:
      if not self.publisher.hf:
        source = param_dict(params)
      else:  # the HF export is written from a Decoder
        source = params if hasattr(params, "config") else self.to_model(params)
      info = self.publisher.publish(source, version, tokenizer=self.tokenizer)
      if self.abort_inflight:
        self.engine.update_weights(info.path, version, abort_inflight=True)
      else:
        self.engine.update_weights(info.path, version)
      self.publisher.gc(in_use=[version])
    if self.version != version:
      raise WeightSyncError(f"engine reports weight version {self.version} after a sync "
                            f"to version {version}")
    self.last_seconds = time.perf_counter() - t0
    return self.last_seconds

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
