"""Test-wide set-up: 8 fake CPU devices (mesh, shard_map and ring tests need them).

XLA reads the flag once, when the backend starts, so it is set before any test
module imports jax.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
