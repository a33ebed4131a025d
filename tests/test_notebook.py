"""The paper notebook runs top to bottom on a small scenario and shows its tables and figures."""
from notebook_runner import run_notebook

from pddsim.experiments.paper import FIGURES

SMALL = ("SESSIONS = 40\nCAPACITY = False\nLOADS = [0.5, 1.0]\nBATHTUB_HITS = [0.0, 0.5, 0.9]\n"
         "BATHTUB_REQUESTS = 20\nRLD_THRESHOLDS_S = [0.5, 2.0]\n")


def test_paper_notebook_runs():
    printed = run_notebook("paper.ipynb", SMALL, figures=4)
    for figure in FIGURES:
        assert figure.label in printed
    for section in ("margin_per_hour", "loads as fractions of", "packed", "rld_token_share"):
        assert section in printed
