"""The paper notebook runs top to bottom on a small scenario and shows its tables and figures."""
from notebook_runner import run_notebook

from pddsim.experiments.paper import FIGURES

SMALL = ("HORIZON_S = 100\nCAPACITY = False\nLOADS = [0.5, 1.0]\nBATHTUB_HITS = [0.0, 0.5, 0.9]\n"
         "BATHTUB_REQUESTS = 20\nRLD_THRESHOLDS_S = [0.5, 2.0]\n")


def test_paper_notebook_runs():
    printed = run_notebook("paper.ipynb", SMALL, figures=4)
    for figure in FIGURES:
        assert figure.label in printed
    for section in ("margin_per_hour", "loads as fractions of", "packed", "rld_token_share"):
        assert section in printed


def test_notebooks_ship_with_their_outputs_and_run_time():
    """A reader opening a notebook sees what it computes without running it, and how long the
    run that made those outputs took (`notebooks/execute.py` makes them)."""
    import re

    import nbformat
    from notebook_runner import NOTEBOOKS, tagged
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code), path.name
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), path.name
        outputs = [o for c in code for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"], path.name
        for cell in tagged(nb, "figure"):
            assert any("image/png" in o.get("data", {}) for o in cell.outputs), (path.name, cell.source)
        (note,) = tagged(nb, "run-time")
        assert re.search(r"ran in \d+ s at the size set above", note.source), path.name
