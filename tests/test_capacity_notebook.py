"""The capacity-planning notebook runs top to bottom on a small scenario and shows its figures and
the chosen splits."""
from notebook_runner import run_notebook

# open loop: a few closed-loop sessions never load a deployment up to its capacity
SMALL = "HORIZON_S = 20\nCOUNTS = 2\nJOBS = 1\nEXTRA = ['workload.replay=open']\n"


def test_capacity_notebook_runs():
    printed = run_notebook("capacity.ipynb", SMALL, figures=2)
    assert "== same-DC PD" in printed and "== PDD" in printed and "chosen splits" in printed
    assert printed.count("best: point") == 2
