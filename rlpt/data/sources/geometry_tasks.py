"""The "geometry" task source: write a trimesh script that builds a described solid.

Each task describes a solid with numeric dimensions and asks for a Python script
that builds it with trimesh and exports it to `out.stl`. `task.answer` holds the
constraints the exported mesh must meet (checked by rlpt.rewards.geometry outside
the sandbox): watertight, volume (relative tolerance), sorted bounding-box
extents (relative tolerance), number of connected surface components, Euler
number, and a face budget. Difficulty levels (`level`, 0..3, drawn from `levels`):
  0  a box                      (volume, extents, 1 body)
  1  a cylinder or a sphere     (curved: tessellation must be fine enough)
  2  a row of k separate cubes  (k components, gaps)
  3  a hollow box (a shell)     (inner cavity: volume = outer - inner, 2 surfaces)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlpt.data.sources import splits
from rlpt.types import Task

OUTPUT = "out.stl"
INSTRUCTION = ("Write a Python script that builds the solid described below with the trimesh "
               f"library and exports it as an STL file named {OUTPUT} in the working directory. "
               "Units are millimetres. Answer with the script in one ```python block.\n\n")


def _r(x: float) -> float:
  return float(round(x, 1))


def _box(rng):
  e = [_r(rng.uniform(5, 60)) for _ in range(3)]
  desc = f"A solid rectangular box measuring {e[0]} x {e[1]} x {e[2]} mm."
  script = f"mesh = trimesh.creation.box(extents={e})"
  return desc, script, dict(volume=e[0] * e[1] * e[2], extents=e, components=1, euler=2,
                            rtol=0.01)


def _round(rng):
  if rng.random() < 0.5:
    r, h = _r(rng.uniform(3, 30)), _r(rng.uniform(5, 80))
    desc = (f"A solid circular cylinder of radius {r} mm and height {h} mm "
            "(volume within 2% of the exact cylinder).")
    script = f"mesh = trimesh.creation.cylinder(radius={r}, height={h}, sections=128)"
    return desc, script, dict(volume=math.pi * r * r * h, extents=[2 * r, 2 * r, h], components=1,
                              euler=2, rtol=0.02)
  r = _r(rng.uniform(3, 30))
  desc = f"A solid sphere of radius {r} mm (volume within 2% of the exact sphere)."
  script = f"mesh = trimesh.creation.icosphere(subdivisions=4, radius={r})"
  return desc, script, dict(volume=4 / 3 * math.pi * r ** 3, extents=[2 * r] * 3, components=1,
                            euler=2, rtol=0.02)


def _row(rng):
  k, s = int(rng.integers(2, 6)), _r(rng.uniform(3, 20))
  gap = _r(rng.uniform(1, 10))
  desc = (f"{k} separate solid cubes of side {s} mm in a row along the x axis, with a gap of "
          f"{gap} mm between neighbouring cubes (they must not touch).")
  script = (f"mesh = trimesh.util.concatenate([trimesh.creation.box(extents=[{s}, {s}, {s}])"
            f".apply_translation([i * ({s} + {gap}), 0, 0]) for i in range({k})])")
  return desc, script, dict(volume=k * s ** 3, extents=[k * s + (k - 1) * gap, s, s],
                            components=k, euler=2 * k, rtol=0.01)


def _shell(rng):
  e = [_r(rng.uniform(20, 60)) for _ in range(3)]
  t = _r(rng.uniform(1, 4))
  inner = [x - 2 * t for x in e]
  desc = (f"A closed hollow box: outer size {e[0]} x {e[1]} x {e[2]} mm, walls {t} mm thick "
          "on every side, with a sealed empty cavity inside (no openings).")
  script = (f"outer = trimesh.creation.box(extents={e})\n"
            f"inner = trimesh.creation.box(extents={[_r(x) for x in inner]})\n"
            "inner.invert()\n"
            "mesh = trimesh.util.concatenate([outer, inner])")
  vol = e[0] * e[1] * e[2] - inner[0] * inner[1] * inner[2]
  return desc, script, dict(volume=vol, extents=e, components=2, euler=4, rtol=0.01)


_LEVELS = (_box, _round, _row, _shell)


@dataclasses.dataclass(frozen=True)
class GeometrySource(splits.GeneratedSource):
  """Seeded, index-addressed "geometry" tasks.

  Attributes:
    levels: difficulty levels to draw from (see module doc).
    max_faces: face budget of the exported mesh.
    seed: stream seed.
  """

  levels: tuple[int, ...] = (0, 1, 2, 3)
  max_faces: int = 200_000
  seed: int = 0
  domain: str = "geometry"

  def __post_init__(self):
    bad = [lv for lv in self.levels if lv not in range(len(_LEVELS))]
    if bad or not self.levels:
      raise ValueError(f"geometry: levels must be in 0..{len(_LEVELS) - 1}, got {self.levels}")

  def _make(self, rng: np.random.Generator) -> Task:
    level = int(self.levels[int(rng.integers(len(self.levels)))])
    desc, script, c = _LEVELS[level](rng)
    constraints = {"watertight": True, "volume": float(c["volume"]),
                   "extents": sorted(float(x) for x in c["extents"]), "rtol": c["rtol"],
                   "components": c["components"], "euler": c["euler"], "max_faces": self.max_faces}
    return Task(self.domain, INSTRUCTION + desc, answer=constraints,
                metadata={"level": level, "reference_script": script})

  def reference(self, task: Task) -> str:
    return ("```python\nimport trimesh\n" + task.metadata["reference_script"]
            + f"\nmesh.export({OUTPUT!r})\n```")
