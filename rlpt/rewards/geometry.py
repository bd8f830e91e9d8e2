"""The "geometry" verifier: the model's trimesh script runs in the sandbox, the mesh
it exports is loaded and checked here, outside.

In the sandbox, harness_geometry.py runs script.py in its own process, kills
everything once it exits or overruns, and only then prints the output file
(base64, size-capped) on a line tagged with a per-run nonce the script never
sees; a script that prints fake results, writes a verdict file or leaves a
symlink gains nothing. Outside, the bytes are parsed as STL by trimesh and the
task's constraints (`task.answer`, see rlpt.data.sources.geometry_tasks) are
checked: non-empty, face budget, watertight with consistent winding, positive
volume within `rtol`, sorted bounding-box extents within `rtol`, connected
components, Euler number. Score = fraction of constraints met ("fraction") or
all-or-nothing ("all", the default: a mesh that is right except for a hole is
not a solid).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import json
import math
import os
import secrets

from rlpt.rewards.code_verifier import SandboxUnavailable, extract_code, sandbox_capacity
from rlpt.rewards.registry import Verifier
from rlpt.types import RewardResult, Task

_HERE = os.path.dirname(os.path.abspath(__file__))
_STATUS_VIOLATION = {"timeout": "timeout", "oom": "resource", "output_limit": "resource"}


@functools.cache
def _harness() -> str:
  with open(os.path.join(_HERE, "harness_geometry.py")) as f:
    return f.read()


def check_mesh(data: bytes, c: dict) -> dict[str, bool]:
  """Each constraint of `c` -> met, for the STL bytes `data` (all False if unparsable)."""
  import numpy as np
  import trimesh
  names = ["nonempty", "faces", "watertight", "volume", "extents", "components", "euler"]
  try:
    mesh = trimesh.load(io.BytesIO(data), file_type="stl", force="mesh", process=True)
  except Exception:  # noqa: BLE001 -- garbage is a failed mesh, not a verifier error
    return dict.fromkeys(names, False)
  if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
    return dict.fromkeys(names, False)
  rtol = float(c.get("rtol", 0.01))
  out = {"nonempty": True, "faces": len(mesh.faces) <= int(c.get("max_faces", 200_000))}
  if not out["faces"]:  # do not spend time on a giant mesh
    return {**dict.fromkeys(names, False), "nonempty": True}
  closed = bool(mesh.is_watertight and mesh.is_winding_consistent)
  out["watertight"] = closed if c.get("watertight", True) else True
  vol = float(mesh.volume) if closed else float("nan")
  out["volume"] = closed and vol > 0 and math.isclose(vol, c["volume"], rel_tol=rtol)
  ext = np.sort(np.asarray(mesh.extents, dtype=float))
  out["extents"] = bool(np.allclose(ext, np.sort(c["extents"]), rtol=rtol, atol=0.0))
  out["components"] = int(mesh.body_count) == int(c["components"])
  out["euler"] = int(mesh.euler_number) == int(c["euler"])
  return out


@dataclasses.dataclass
class GeometryVerifier(Verifier):
  """Runs the completion's script in the sandbox and checks the exported mesh.

  Attributes:
    scoring: "all" (1 only when every constraint holds) or "fraction".
    timeout_s: sandbox wall-clock limit (seconds); the script gets 2 s less.
    max_bytes: largest accepted output file.
    memory_mb, max_pids: sandbox limits.
  """

  scoring: str = "all"
  timeout_s: float | None = 20.0
  max_bytes: int = 6_000_000
  memory_mb: int = 1024
  max_pids: int = 64
  isolation: str = "inline"

  def capacity(self):
    return sandbox_capacity("geometry verifier")

  def __post_init__(self):
    if self.scoring not in ("fraction", "all"):
      raise ValueError(f"GeometryVerifier.scoring must be 'fraction' or 'all', got {self.scoring!r}")

  def verify(self, task: Task, completion: str) -> RewardResult:
    from rlpt import sandbox
    c = task.answer
    if not isinstance(c, dict) or not {"volume", "extents", "components", "euler"} <= set(c):
      raise ValueError("geometry task needs answer=<constraints dict with volume, extents, "
                       "components, euler>")
    script = extract_code(completion)
    if script is None:
      return RewardResult(0.0, ("format",), details={"reason": "no ```python block"})
    nonce = secrets.token_hex(16)
    job = {"nonce": nonce, "budget_s": max(1.0, float(self.timeout_s) - 2.0),
           "output": task.metadata.get("output", "out.stl"), "max_bytes": self.max_bytes}
    res = sandbox.run({"harness.py": _harness(), "job.json": json.dumps(job), "script.py": script},
                      ["python3", "-I", "harness.py"], timeout_s=float(self.timeout_s),
                      memory_mb=self.memory_mb, max_pids=self.max_pids,
                      max_output_bytes=self.max_bytes * 4 // 3 + 4096)
    details = {"status": res.status, "wall_s": res.wall_s}
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce + " ")]
    try:
      out = json.loads(lines[0][len(nonce) + 1:]) if len(lines) == 1 else None
    except ValueError:
      out = None
    if not isinstance(out, dict):
      if res.status == "infra_error":
        raise SandboxUnavailable(f"geometry verifier: the sandbox could not run the script: "
                                 f"{res.stderr[-300:]}")
      return RewardResult(0.0, (_STATUS_VIOLATION.get(res.status, "sandbox"),),
                          details={**details, "reason": "no valid harness record"})
    details.update(exit_code=out.get("exit_code"), error=out.get("error"), size=out.get("size"))
    violations = ("timeout",) if out.get("timed_out") else ()
    if out.get("file") is None:
      if "larger than" in str(out.get("error")):
        violations += ("resource",)
      return RewardResult(0.0, violations, details=details)
    checks = check_mesh(base64.b64decode(out["file"]), c)
    details["checks"] = checks
    met = sum(checks.values())
    score = float(met == len(checks)) if self.scoring == "all" else met / len(checks)
    return RewardResult(score, violations, details=details)
