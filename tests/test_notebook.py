"""The paper notebook runs top to bottom on a small scenario and shows its tables and figures."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from pddsim.experiments.paper import FIGURES  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SMALL = ("SESSIONS = 40\nCAPACITY = False\nLOADS = [0.5, 1.0]\nBATHTUB_HITS = [0.0, 0.5, 0.9]\n"
         "BATHTUB_REQUESTS = 20\nRLD_THRESHOLDS_S = [0.5, 2.0]\n")


def tagged(nb, tag):
    return [c for c in nb.cells if tag in c.metadata.get("tags", [])]


def test_paper_notebook_runs():
    nb = nbformat.read(NOTEBOOKS / "paper.ipynb", as_version=4)
    (params,) = tagged(nb, "parameters")
    params.source = SMALL
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = tagged(nb, "figure")
    assert len(figures) == 4
    for cell in figures:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), cell.source
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    for figure in FIGURES:
        assert figure.label in printed
    for section in ("margin_per_hour", "loads as fractions of", "packed", "rld_token_share"):
        assert section in printed
