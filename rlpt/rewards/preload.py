"""Imported once by the worker pool's forkserver, never by the library itself:
loads the verifiers, warms math-verify's lazily built LaTeX parser and builds
every reasoning-gym scorer (some load word lists or puzzle sets, up to ~0.6 s
each), so every worker forked from it (including the replacement of a killed
one) starts hot."""

import logging

import rlpt.rewards  # noqa: F401 -- registers the built-in verifiers
from rlpt.rewards import math_verifier, rg

logging.getLogger("math_verify").setLevel(logging.ERROR)
math_verifier.MathVerifier().verify(
    rlpt.types.Task("math", "warm-up", r"\frac{1}{2}"), r"\boxed{0.5} <answer>x</answer>")
for _name in rg.generators():
  if _name != "composite":
    rg.warm_scorer(_name)
