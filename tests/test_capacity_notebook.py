"""The capacity-planning notebook runs top to bottom on a small scenario and shows its figures and
the chosen splits."""

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from test_notebook import NOTEBOOKS, tagged  # noqa: E402

# open loop: a few closed-loop sessions never load a deployment up to its capacity
SMALL = "SESSIONS = 8\nCOUNTS = 2\nJOBS = 1\nEXTRA = ['workload.replay=open']\n"


def test_capacity_notebook_runs():
    nb = nbformat.read(NOTEBOOKS / "capacity.ipynb", as_version=4)
    (params,) = tagged(nb, "parameters")
    params.source = SMALL
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = tagged(nb, "figure")
    assert len(figures) == 2
    for cell in figures:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), cell.source
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert "== same-DC PD" in printed and "== PDD" in printed and "chosen splits" in printed
    assert printed.count("best: point") == 2
