"""How dots are traced on this backend: the CPU's numerics choices and the switch that
traces what an accelerator runs instead.

- `cpu_blocking()`: on XLA:CPU the decoder's projections sum long contractions in
  blocks (rlpt.models.projections.proj, for HF parity); `accelerator_dots()` turns
  that off at trace time (launch.plan compiles an accelerator's step under it).
- `dot_operand(x, dt)`: bfloat16 compute on XLA:CPU is emulated. Its runtime has no
  unfused bf16 x bf16 -> f32 dot, and the learner's backward pass compiles to one (a
  weight gradient contracting the token axis fails with "Unsupported element type for
  DotThunk::Execute: BF16 x BF16 = F32"). Emulated, an operand is rounded to bf16 and
  widened back to f32: the dot multiplies the bf16 values an accelerator's bf16 dot
  would and sums in f32 as it does (a product of two bf16 values is exact in f32), so
  only the order of the f32 sums can differ. The learner and the engine round at the
  same places (every dot operand and the dense attention's probabilities; the cached
  decode kernel sums its probabilities unrounded), and launch.bench bf16 measures the
  gap between the logprobs the engine samples with and those the learner scores.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

_PLAIN_DOTS = contextvars.ContextVar("rlpt_plain_dots", default=False)


@contextlib.contextmanager
def accelerator_dots():
  """Within it, dots are traced as an accelerator runs them, also on the CPU backend:
  no blocked contractions, bf16 dots as bf16. It acts at trace time: a function
  jitted and traced before keeps its program."""
  token = _PLAIN_DOTS.set(True)
  try:
    yield
  finally:
    _PLAIN_DOTS.reset(token)


def cpu_blocking() -> bool:
  """Whether dots are traced with the CPU's numerics choices right now (the CPU backend,
  outside `accelerator_dots()`)."""
  return jax.default_backend() == "cpu" and not _PLAIN_DOTS.get()


def emulates_bf16(dt) -> bool:
  """Whether dots of compute dtype `dt` are emulated in float32 right now."""
  return jnp.dtype(dt) == jnp.bfloat16 and cpu_blocking()


def dot_operand(x, dt):
  """`x` as a dot operand of compute dtype `dt`: `x.astype(dt)`, or where
  `emulates_bf16(dt)` rounded to bf16 and widened back to float32. Gradients flowing
  back through the rounding are rounded to bf16 too, as in bf16 training."""
  x = x.astype(dt)
  return x.astype(jnp.float32) if emulates_bf16(dt) else x
