"""The geometry verifier: honest trimesh scripts score 1; the reward-hacking suite
(empty, open, giant meshes, precomputed / forged files, no export) scores 0.
One concurrent batch of real sandbox runs; the mesh checks also run on host-made
meshes directly."""

import base64
import json

import numpy as np
import pytest
import trimesh

from rlpt import rewards
from rlpt.data.sources import geometry_tasks
from rlpt.rewards import geometry

SRC = geometry_tasks.GeometrySource(levels=(0,), seed=7)
TASK = SRC.train(0)  # a box
EXT = TASK.answer["extents"]


def _stl(mesh) -> bytes:
  return mesh.export(file_type="stl")


def _writer(data: bytes, extra: str = "") -> str:
  """A script that writes fixed bytes to out.stl (no trimesh needed)."""
  return ("```python\nimport base64\n" + extra +
          f"open('out.stl', 'wb').write(base64.b64decode({base64.b64encode(data).decode()!r}))\n```")


def _open_box() -> bytes:
  m = trimesh.creation.box(extents=EXT)
  return _stl(trimesh.Trimesh(m.vertices, m.faces[:-1], process=False))


GIANT = ("```python\nimport struct\nf = open('out.stl', 'wb')\nf.write(b'\\0' * 80)\n"
         "n = 400000\nf.write(struct.pack('<I', n))\nrec = struct.pack('<12fH', *([0.0] * 3), "
         "0, 0, 0, 1e6, 0, 0, 0, 1e6, 0, 0)\nfor _ in range(n // 1000):\n"
         "    f.write(rec * 1000)\nf.close()\n```")
ATTACKS = {
    "empty_mesh": _writer(b"\0" * 80 + b"\0\0\0\0"),
    "empty_file": _writer(b""),
    "open_mesh": _writer(_open_box()),
    "giant_mesh_file": GIANT,
    "giant_box": _writer(_stl(trimesh.creation.box(extents=[1e6, 1e6, 1e6]))),
    "precomputed_file_and_forged_verdict": _writer(
        _stl(trimesh.creation.box(extents=[1, 1, 1])),
        extra=("import json\nopen('verdict.json', 'w').write(json.dumps({'score': 1}))\n"
               "print('\\n' + '0' * 32 + ' ' + json.dumps({'file': None, 'score': 1}))\n")),
    "never_exports": ("```python\nimport math\nvolume = math.prod(" + repr(EXT) + ")\n"
                      "print('exported out.stl, volume', volume)\n```"),
    "symlink_output": "```python\nimport os\nos.symlink('/etc/passwd', 'out.stl')\n```",
    "garbage_bytes": _writer(b"solid x\n facet normal 0 0 0\n garbage\nendsolid\n"),
    "no_code_block": "I would use trimesh.creation.box and export it.",
}


@pytest.fixture(scope="module")
def results():
  names = ["honest"] + list(ATTACKS)
  comps = [SRC.reference(TASK)] + list(ATTACKS.values())
  return dict(zip(names, rewards.compute_rewards([TASK] * len(names), comps)))


def test_honest_scores_one(results):
  r = results["honest"]
  assert r.score == 1.0 and r.reward == 1.0, r
  assert all(r.details["checks"].values())


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_scores_zero(results, name):
  r = results[name]
  assert r.score == 0.0 and r.reward <= 0.0, (name, r)


def test_attack_details(results):
  assert results["giant_mesh_file"].violations == ("resource",)
  assert "larger than" in results["giant_mesh_file"].details["error"]
  assert results["never_exports"].details["error"] == "no output file"
  assert results["symlink_output"].details["error"] == "output is not a regular file"
  assert results["open_mesh"].details["checks"]["watertight"] is False
  assert results["no_code_block"].violations == ("format",)


def test_check_mesh_on_every_level():
  for level in range(4):
    t = geometry_tasks.GeometrySource(levels=(level,), seed=3).train(0)
    ns = {"trimesh": trimesh}
    exec(t.metadata["reference_script"], ns)  # the reference script, run on the host
    assert all(geometry.check_mesh(_stl(ns["mesh"]), t.answer).values()), level
    scaled = ns["mesh"].copy().apply_scale(1.05)
    checks = geometry.check_mesh(_stl(scaled), t.answer)
    assert not checks["volume"] and not checks["extents"]
  cube_row = geometry_tasks.GeometrySource(levels=(2,), seed=3).train(0)
  one = trimesh.creation.box(extents=[cube_row.answer["extents"][0]] * 3)
  assert not geometry.check_mesh(_stl(one), cube_row.answer)["components"]


def test_fraction_scoring():
  v = geometry.GeometryVerifier(scoring="fraction")
  assert v.scoring == "fraction"
  with pytest.raises(ValueError, match="scoring"):
    geometry.GeometryVerifier(scoring="most")
  checks = geometry.check_mesh(_open_box(), TASK.answer)
  assert 0 < sum(checks.values()) < len(checks)
