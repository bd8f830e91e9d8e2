"""Every notebook under notebooks/ runs top to bottom against the library.

nbformat/nbclient are not dependencies, so the notebook's JSON is read directly
and its code cells are executed in order in one namespace; a failing assertion
inside a cell fails the test, naming the notebook and the cell.
"""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook():
  assert NOTEBOOKS, "notebooks/ holds no .ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
  nb = json.loads(path.read_text())
  assert nb["nbformat"] == 4
  namespace = {"__name__": "__notebook__"}
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert cells
  for i, cell in enumerate(cells):
    src = "".join(cell["source"])
    try:
      exec(compile(src, f"{path.name}[code cell {i}]", "exec"), namespace)  # noqa: S102
    except Exception as e:
      raise AssertionError(f"{path.name}: code cell {i} failed: {type(e).__name__}: {e}") from e
