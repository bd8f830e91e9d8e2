"""Orbax checkpoints of a training run, with integrity checks and fallback.

    ckpt = Checkpointer(workdir.checkpoints, keep=3)
    ckpt.save(step, {"params": params, "opt_state": opt_state, "rng": key},
              extra={"mixer": mixer.get_state()})         # async: returns at once
    info = ckpt.restore(target={"params": params, ...})    # abstract or concrete target
    if info is not None:
      state, extra, step = info.state, info.extra, info.step

One checkpoint per step directory (`checkpoints/<step>/`) holds two Orbax items:
`state` (any pytree of arrays: params, optimizer state, step counters, RNG keys;
typed PRNG keys are stored as their uint32 key data and rebuilt on restore) and
`extra` (a JSON-able dict: data/mixer iterator state, trajectory counters, ...).
Saves run asynchronously through Orbax's CheckpointManager; restore puts every
array straight into the target's shardings.

Integrity: once a save has committed, `rlpt_integrity.json` is written into its
step directory with the size and CRC-32 of every file. On restore the newest
step is checked against it (and then restored); a step whose files are missing,
truncated or altered, or whose restore raises, is logged as a warning, moved to
`<checkpoints>.corrupt/`, reported in `RestoreInfo.skipped`, and the next older
step is tried. A step without the manifest (the process died between the commit
and the manifest) is accepted only if Orbax restores it without error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
import weakref
import zlib
from typing import Any

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

INTEGRITY_FILE = "rlpt_integrity.json"

# Orbax keys an operation's signals by one process-wide "current operation id", so two
# operations in flight at once from two threads (the async loop publishes weights on a
# background thread while the loop thread checkpoints) can wait on each other's keys
# until Orbax's timeout. ORBAX_LOCK is held while an operation starts (a checkpoint
# save here, a publish in rlpt.train.publish), and a publish first waits for the
# async checkpoint saves still in flight (`quiesce_saves`), so operations never overlap.
ORBAX_LOCK = threading.RLock()
_IN_FLIGHT: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()


def quiesce_saves() -> None:
  """Waits for every Checkpointer's async save in flight (call with ORBAX_LOCK held)."""
  for c in list(_IN_FLIGHT):
    c._finish_pending()


class CheckpointError(RuntimeError):
  """No usable checkpoint although some exist (every one failed its checks)."""


@dataclasses.dataclass
class RestoreInfo:
  """What `Checkpointer.restore` found.

  Attributes:
    step: the step of the checkpoint restored.
    state: the restored pytree (same structure and shardings as the target).
    extra: the JSON dict saved with it.
    skipped: (step, reason) for each newer checkpoint rejected as corrupt.
  """

  step: int
  state: Any
  extra: dict[str, Any]
  skipped: list[tuple[int, str]]


def _is_key(x) -> bool:
  return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(tree):
  """Typed PRNG keys -> uint32 key data (Orbax stores plain arrays). In a multi-process
  run, arrays local to this process (the loop's key: every process holds the same one)
  go as numpy arrays, which Orbax writes once; global arrays are written by all."""
  multi = jax.process_count() > 1

  def plain(x):
    if _is_key(x):
      x = jax.random.key_data(x)
    if multi and isinstance(x, jax.Array) and x.is_fully_addressable:
      return np.asarray(x)
    return x
  return jax.tree.map(plain, tree)


def _abstract(x):
  if _is_key(x):
    x = jax.eval_shape(jax.random.key_data, x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  x = np.asarray(x)
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _crc32(path: str) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(1 << 22):
      crc = zlib.crc32(chunk, crc)
  return crc


def _file_table(step_dir: str) -> dict[str, list[int]]:
  """relative path -> [size in bytes, crc32] of every file under `step_dir`."""
  table = {}
  for root, _, files in os.walk(step_dir):
    for fn in files:
      full = os.path.join(root, fn)
      rel = os.path.relpath(full, step_dir)
      if rel in (INTEGRITY_FILE, INTEGRITY_FILE + ".tmp"):
        continue
      table[rel] = [os.path.getsize(full), _crc32(full)]
  return table


def verify_step_dir(step_dir: str) -> str | None:
  """None if every file listed in the step's integrity manifest is intact, else
  a reason ("missing file ...", "size ...", "checksum ..."). A step dir without a
  manifest returns None (it cannot be checked this way)."""
  manifest = os.path.join(step_dir, INTEGRITY_FILE)
  if not os.path.exists(manifest):
    return None
  try:
    with open(manifest) as f:
      want = json.load(f)["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"unreadable integrity manifest {manifest}: {e}"
  for rel, (size, crc) in sorted(want.items()):
    full = os.path.join(step_dir, rel)
    if not os.path.exists(full):
      return f"missing file {rel}"
    got = os.path.getsize(full)
    if got != size:
      return f"size of {rel} is {got} bytes, {size} were written"
    if _crc32(full) != crc:
      return f"checksum mismatch in {rel}"
  return None


class Checkpointer:
  """Async Orbax checkpoints of (state pytree, extra JSON dict) per step.

  Args:
    directory: where step directories go (WORKDIR/checkpoints).
    keep: how many of the newest checkpoints to keep.
    async_save: write in a background thread (save returns after the device ->
      host copy).
  """

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"checkpoint.keep must be >= 1, got {keep}")
    self.directory = os.path.abspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self._options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self._mngr = self._new_manager()
    self._unverified: list[int] = []  # committed (or committing) steps awaiting a manifest

  def _new_manager(self) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(self.directory, options=self._options,
                                 item_names=("state", "extra"))

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(self, step: int, state: Any, extra: dict[str, Any] | None = None) -> float:
    """Starts saving `state` (pytree of arrays) and `extra` (JSON dict) as `step`.

    Returns the seconds the call blocked (the rest of the write is async).
    """
    t0 = time.perf_counter()
    extra = dict(extra or {})
    try:
      json.dumps(extra)
    except TypeError as e:
      raise TypeError(f"checkpoint extra must be JSON-serializable: {e}") from e
    with ORBAX_LOCK:
      self._finish_pending()
      saved = self._mngr.save(
          int(step), args=ocp.args.Composite(
              state=ocp.args.StandardSave(_keys_to_data(state)),
              extra=ocp.args.JsonSave(extra)), force=True)
    if saved:
      self._unverified.append(int(step))
      _IN_FLIGHT.add(self)
    return time.perf_counter() - t0

  def _finish_pending(self) -> None:
    """Waits for the in-flight save, then writes the manifests of committed steps."""
    with ORBAX_LOCK:  # also called from a publishing thread (quiesce_saves)
      if not self._unverified:
        return
      self._mngr.wait_until_finished()
      _IN_FLIGHT.discard(self)
      for step in self._unverified:
        d = self.step_dir(step)
        # one writer: in a multi-process job every process saved its shards, and
        # process 0 lists them once all have committed
        if os.path.isdir(d) and jax.process_index() == 0:
          table = _file_table(d)
          tmp = os.path.join(d, INTEGRITY_FILE + ".tmp")
          with open(tmp, "w") as f:
            json.dump({"step": step, "files": table}, f)
          os.replace(tmp, os.path.join(d, INTEGRITY_FILE))
      self._unverified.clear()

  def wait(self) -> None:
    """Blocks until every started save is committed and verified on disk."""
    self._finish_pending()
    self._mngr.wait_until_finished()

  def _quarantine(self, step: int) -> str:
    dest_root = self.directory.rstrip("/") + ".corrupt"
    if jax.process_index() != 0:  # every process skips the step; process 0 moves it
      return os.path.join(dest_root, str(step))
    os.makedirs(dest_root, exist_ok=True)
    dest = os.path.join(dest_root, f"{step}.{int(time.time())}")
    shutil.move(self.step_dir(step), dest)
    return dest

  def restore(self, target: Any, step: int | None = None) -> RestoreInfo | None:
    """Restores the newest intact checkpoint (or exactly `step`).

    Args:
      target: a pytree shaped like the saved state: concrete arrays or
        jax.ShapeDtypeStructs (their shardings say where restored arrays go);
        typed PRNG keys in it come back as typed keys.
      step: restore this step only (no fallback); None = newest good one.

    Returns:
      RestoreInfo, or None when the directory holds no checkpoint.

    Raises:
      CheckpointError: checkpoints exist but none is usable (or `step` is not).
    """
    self.wait()
    candidates = [step] if step is not None else list(reversed(self.all_steps()))
    if not candidates:
      return None
    abstract = jax.tree.map(_abstract, target)
    skipped: list[tuple[int, str]] = []
    for s in candidates:
      reason = verify_step_dir(self.step_dir(s))
      restored = None
      if reason is None:
        try:
          restored = self._mngr.restore(s, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract), extra=ocp.args.JsonRestore()))
        except Exception as e:  # noqa: BLE001 -- any failure means this step is unusable
          reason = f"restore failed: {type(e).__name__}: {str(e)[:300]}"
      if reason is not None:
        skipped.append((s, reason))
        if step is not None:
          raise CheckpointError(f"checkpoint {self.step_dir(s)} is unusable: {reason}")
        dest = self._quarantine(s)
        logging.warning("CORRUPT CHECKPOINT at step %d (%s): moved to %s; trying an older one",
                        s, reason, dest)
        continue
      state = jax.tree.map(_rebuild_key, target, restored.state)
      extra = dict(restored.extra)
      if skipped:
        self._mngr = self._new_manager()  # forget the quarantined steps
        logging.warning("resumed from step %d after skipping corrupt checkpoint(s) %s",
                        s, [k for k, _ in skipped])
      return RestoreInfo(step=s, state=state, extra=extra, skipped=skipped)
    self._mngr = self._new_manager()
    raise CheckpointError(
        f"every checkpoint in {self.directory} is corrupt: "
        + "; ".join(f"step {k}: {r}" for k, r in skipped)
        + f" (moved to {self.directory}.corrupt/). Delete the workdir's checkpoints to start over.")

  def close(self) -> None:
    self.wait()
    self._mngr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _rebuild_key(target_leaf, restored_leaf):
  if _is_key(target_leaf):
    return jax.random.wrap_key_data(restored_leaf, impl=jax.random.key_impl(target_leaf))
  return restored_leaf
