"""One-token attention over a KV cache that reads each row only up to its own length.

A decode step's query of row b attends to the cached slots j < length[b] with
valid[b, j]. XLA can only express that as a read of all S slots of every row plus a
mask, so a batch costs its longest row times B; on CPU that read was ≈100 ms of a
≈250 ms SmolLM2 decode step at B=64 (S=384, ≈156 slots in use per row). This module
compiles a small C++ XLA FFI handler (rlpt/ops/csrc/decode_attention.cc) that reads
only the slots each row holds, shares the (row, KV head) pairs between the calling
thread and XLA's intra-op thread pool, and computes in float32 like the XLA path.

`cache_attention(q, k, v, valid, length, scale)` returns the un-normalised softmax
pieces (m, z, o) that `rlpt.models.kv_cache.attend` merges with the new tokens; it
runs the kernel on CPU and `cache_attention_reference` (plain XLA, the same maths)
elsewhere or when the kernel cannot be built.

The shared library is built on first use with the C++ compiler in $CXX (default g++,
which `make setup` installs) against jaxlib's FFI headers, with -march=native for the
machine it runs on, into $RLPT_KERNEL_DIR (default ~/.cache/rlpt/kernels), under a
name that hashes the source, the compiler, the flags, jaxlib's version and the CPU.
If the build fails, a warning says why (compiler output included) and the XLA path
is used; nothing else changes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shlex
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

SOURCE = pathlib.Path(__file__).resolve().parent / "csrc" / "decode_attention.cc"
TARGET = "rlpt_decode_attention"
CXXFLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")

_log = logging.getLogger(__name__)


class KernelBuildError(RuntimeError):
  """The C++ kernel could not be compiled or loaded (the message has the compiler
  command and its output)."""


def _cpu_id() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return hashlib.sha256(line.encode()).hexdigest()[:12]
  except OSError:
    pass
  return platform.machine()


def library_path() -> pathlib.Path:
  """Where the built library for this source, compiler, flags, jaxlib and CPU lives."""
  import jaxlib
  cxx = os.environ.get("CXX", "g++")
  key = hashlib.sha256()
  for part in (SOURCE.read_bytes(), cxx.encode(), " ".join(CXXFLAGS).encode(),
               jaxlib.__version__.encode(), _cpu_id().encode()):
    key.update(part)
  root = pathlib.Path(os.environ.get("RLPT_KERNEL_DIR",
                                     pathlib.Path.home() / ".cache" / "rlpt" / "kernels"))
  return root / f"decode_attention-{key.hexdigest()[:16]}.so"


def build() -> pathlib.Path:
  """Compiles the kernel unless an up-to-date build exists; returns the library path.

  Raises KernelBuildError with the command and the compiler's output on failure.
  Safe to call from several processes at once (each builds into a temporary file
  and renames it into place).
  """
  out = library_path()
  if out.exists():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  cxx = shlex.split(os.environ.get("CXX", "g++"))
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
  os.close(fd)
  cmd = [*cxx, *CXXFLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", tmp]
  try:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  except (OSError, subprocess.TimeoutExpired) as e:
    os.unlink(tmp)
    raise KernelBuildError(f"decode_attention: could not run {shlex.join(cmd)}: {e}") from e
  if res.returncode != 0:
    os.unlink(tmp)
    raise KernelBuildError(f"decode_attention: {shlex.join(cmd)} failed "
                           f"(exit {res.returncode}):\n{res.stderr[-4000:]}")
  os.replace(tmp, out)
  return out


@functools.cache
def _load() -> bool:
  """Builds (if needed), loads and registers the kernel once per process; False, with
  a warning saying why, if that fails."""
  try:
    lib = ctypes.cdll.LoadLibrary(str(build()))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.RlptDecodeAttention),
                                platform="cpu")
  except (KernelBuildError, OSError, AttributeError) as e:
    _log.warning("rlpt CPU decode-attention kernel unavailable, using the XLA path: %s", e)
    return False
  return True


def kernel_available() -> bool:
  """True if the CPU kernel is built and registered in this process."""
  return _load()


def cache_attention_reference(q_BxKxGxDh, k_BxKxSxDh, v_BxKxSxDh, valid_BxS, length_B,
                              scale: float):
  """The same maths as the kernel with XLA ops (every one of the S slots read).

  Returns (m, z, o): float32[B, K, G], [B, K, G], [B, K, G, Dh]; m = max score over
  the readable slots (-1e30 if none), z = sum of exp(score - m) and o = sum of
  exp(score - m) * value over them (0 if none).
  """
  S = k_BxKxSxDh.shape[2]
  ok = valid_BxS & (jnp.arange(S)[None, :] < length_B[:, None])  # [B, S]
  okb = ok[:, None, None, :]
  # Broadcast multiply + reduce, not a batched [G, Dh] x [Dh, S] dot: B x K tiny GEMMs
  # run far below memory bandwidth on XLA:CPU.
  # Products in the inputs' dtype (bfloat16 compute stays bfloat16), sums in float32.
  s = jnp.sum(q_BxKxGxDh[:, :, :, None, :] * k_BxKxSxDh[:, :, None], axis=-1,
              dtype=jnp.float32) * scale
  s = jnp.where(okb, s, jnp.float32(-1e30))
  m = jnp.max(s, axis=-1)
  p = jnp.where(okb, jnp.exp(s - m[..., None]), 0.0)
  o = jnp.sum(p.astype(v_BxKxSxDh.dtype)[..., None] * v_BxKxSxDh[:, :, None], axis=-2,
              dtype=jnp.float32)
  return m, jnp.sum(p, axis=-1), o


def _kernel_call(q, k, v, valid, length, scale):
  B, K, G, Dh = q.shape
  f32 = jnp.float32
  out = (jax.ShapeDtypeStruct((B, K, G), f32), jax.ShapeDtypeStruct((B, K, G), f32),
         jax.ShapeDtypeStruct((B, K, G, Dh), f32))
  return jax.ffi.ffi_call(TARGET, out)(q, k, v, valid, length.astype(jnp.int32),
                                       scale=np.float32(scale))


def cache_attention(q_BxKxGxDh, k_BxKxSxDh, v_BxKxSxDh, valid_BxS, length_B, scale: float,
                    use_kernel: bool = True):
  """Softmax pieces of one query per (row, KV head, group) over the cached slots
  j < length[b] with valid[b, j] (see `cache_attention_reference` for the outputs).

  Args:
    q_BxKxGxDh: float32 queries (after RoPE), G = query heads per KV head.
    k_BxKxSxDh, v_BxKxSxDh: float32 cached keys / values of one layer.
    valid_BxS: bool, slots that hold a real token.
    length_B: int32, slots from 0 that may be read (the row's next write index).
    scale: the softmax scale (1 / sqrt(Dh)).
    use_kernel: False forces the XLA path.
  On CPU (and float32, with the kernel built) the C++ kernel runs, reading row b's
  first length[b] slots only; on other platforms the XLA reference. The two agree to
  float32 rounding (tests/ops/test_decode_attention.py).
  """
  args = (q_BxKxGxDh, k_BxKxSxDh, v_BxKxSxDh, valid_BxS, length_B)
  ref = functools.partial(cache_attention_reference, scale=scale)
  if not (use_kernel and all(x.dtype == jnp.float32 for x in args[:3]) and _load()):
    return ref(*args)
  return jax.lax.platform_dependent(
      *args, cpu=functools.partial(_kernel_call, scale=scale), default=ref)
