"""The capacity-planning notebook runs top to bottom on a small scenario and shows its figures and
the chosen splits."""
from notebook_runner import run_notebook

# single-turn sessions with short answers over 200 s: each run reaches its plateau within seconds
SMALL = ("HORIZON_S = 200\nCOUNTS = 2\nJOBS = 1\nEXTRA = ['workload.synthetic.knobs.turns_mean=1', "
         "'workload.synthetic.knobs.output_mean=100']\n")


def test_capacity_notebook_runs():
    printed = run_notebook("capacity.ipynb", SMALL, figures=2)
    assert "== same-DC PD" in printed and "== PDD" in printed and "chosen splits" in printed
    assert printed.count("best: point") == 2
