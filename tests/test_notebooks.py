"""Every notebook under notebooks/ runs top to bottom in a real Jupyter kernel.

Each notebook is executed with nbclient in a fresh "python3" kernel (ipykernel), with
the repository root as working directory, as `jupyter nbconvert --execute` would. The
kernel inherits this process's environment (tests/conftest.py: CPU JAX, 8 fake devices,
the shared compilation cache) and must run this interpreter (the kernelspec's "python"
resolves to `sys.executable`; a probe cell checks it before the notebook runs). A
failing cell fails the test, naming the notebook, the cell (numbered from 0 as in the
file, markdown cells included) and the error; each notebook must also render a plot (an
image/png output). The notebooks train small runs, hence `slow`; they are stored
without outputs.
"""

import json
import pathlib
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # the kernel colours its tracebacks
_PROBE = "import json, sys\nprint(json.dumps({'executable': sys.executable, 'prefix': sys.prefix}))"


def test_there_is_a_notebook():
  assert NOTEBOOKS, "notebooks/ holds no .ipynb"


def _first_line(cell) -> str:
  return next((ln for ln in cell.source.splitlines() if ln.strip()), "")[:80]


def _kernel_python(client, probe, index) -> dict:
  """{executable, prefix} of the client's kernel, by running `probe` at `index`."""
  client.execute_cell(probe, index, store_history=False)
  out = "".join(o.text for o in probe.outputs if o.output_type == "stream" and o.name == "stdout")
  assert out.strip(), f"the kernel probe printed nothing: {probe.outputs}"
  return json.loads(out.strip().splitlines()[-1])


def _run(path: pathlib.Path):
  """The notebook executed top to bottom in a fresh kernel of this interpreter."""
  nb = nbformat.read(path, as_version=4)
  assert nb.nbformat == 4 and nb.metadata.get("kernelspec", {}).get("name") == "python3"
  client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                          resources={"metadata": {"path": str(ROOT)}})
  cells = list(nb.cells)
  probe = nbformat.v4.new_code_cell(_PROBE)
  nb.cells.append(probe)   # its slot: nbclient writes each cell back by index; removed below
  try:
    with client.setup_kernel():
      kernel = _kernel_python(client, probe, len(cells))
      assert kernel["prefix"] == sys.prefix, (
          f"the notebook kernel runs {kernel['executable']} (prefix {kernel['prefix']}), "
          f"not this interpreter {sys.executable} (prefix {sys.prefix})")
      for i, cell in enumerate(cells):
        try:
          client.execute_cell(cell, i, execution_count=client.code_cells_executed + 1)
        except CellExecutionError as e:
          pytest.fail(f"{path.name}: cell {i} ({_first_line(cell)!r}) failed: "
                      f"{e.ename}: {e.evalue}\n{_ANSI.sub('', str(e))}", pytrace=False)
        except CellTimeoutError as e:
          pytest.fail(f"{path.name}: cell {i} ({_first_line(cell)!r}) timed out after "
                      f"{CELL_TIMEOUT_S} s: {e}", pytrace=False)
  finally:
    nb.cells.pop()
  return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
  """The repository holds the notebooks' source only (clear outputs before saving)."""
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  dirty = [i for i, c in enumerate(nb.cells)
           if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
  assert not dirty, f"{path.name}: cells {dirty} hold outputs; clear them before saving"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path, monkeypatch):
  monkeypatch.setenv("TMPDIR", str(tmp_path))   # the kernel's tempfile workdirs go here
  nb = _run(path)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code, f"{path.name} has no code cell"
  images = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and any("image/png" in o.get("data", {}) for o in c.outputs)]
  assert images, f"{path.name}: no cell rendered a plot (no image/png output)"
