"""Run a bundled notebook top to bottom with its parameters cell replaced, as a reader would."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def tagged(nb, tag):
    return [c for c in nb.cells if tag in c.metadata.get("tags", [])]


def run_notebook(name: str, parameters: str, figures: int) -> str:
    """Execute `name` with `parameters` as its parameters cell; check it raised nothing and that
    each of its `figures` figure cells drew an image; return what it printed."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    (params,) = tagged(nb, "parameters")
    params.source = parameters
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    cells = tagged(nb, "figure")
    assert len(cells) == figures
    for cell in cells:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), cell.source
    return "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
