"""Test-wide set-up: 8 fake CPU devices (mesh, shard_map and ring tests need them),
and a persistent XLA compilation cache shared by the test processes.

XLA reads the flag once, when the backend starts, so it is set before any test
module imports jax. The cache only skips recompiling programs already compiled by
an earlier process (subprocess tests, a second `make test`); it changes no result.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "rlpt-test-jax-cache"))
