"""The stationary window: warm-up deleted by MSER-5, the drain after the last session start left
out, a trend flagged."""
import numpy as np
import pandas as pd
import pytest

from pddsim.stationary import (
    in_flight,
    issue_end,
    mser,
    steady_summary,
    steady_window,
    window_figures,
)
from pddsim.workload.synthetic import poisson_workload


def frame(arrival, finish, session=None):
    n = len(arrival)
    return pd.DataFrame({"arrival_s": arrival, "finish_s": finish,
                         "session": session if session is not None else -np.ones(n, dtype=int),
                         "slo_met": np.ones(n, dtype=bool)})


def test_a_stationary_run_keeps_all_but_its_ramp(make_config):
    """Poisson arrivals at 4/s into one fast server: the window covers nearly the whole issue
    span and its rate is the offered one."""
    from pddsim.sim import simulate
    cfg = make_config(roles=(("colocated", 1),))
    w = poisson_workload(3000, 4.0, 300, 20, seed=1, input_sigma=0.2, output_sigma=0.2)
    s = simulate(cfg, w).summary
    assert s["steady_stationary"]
    span = max(r.arrival_s for r in w.requests)
    assert s["steady_window_start_s"] < 0.2 * span
    assert s["steady_window_end_s"] == pytest.approx(span)
    assert s["steady_rps"] == pytest.approx(4.0, rel=0.05)


def test_a_run_overloaded_from_the_start_is_not_stationary():
    """Requests arrive at 2/s and are served at 1/s: the backlog grows all along."""
    arrival = np.arange(2000) / 2.0
    finish = np.arange(1, 2001) / 1.0
    s = steady_summary(frame(arrival, finish))
    assert not s["steady_stationary"] and s["steady_rps"] is None


def test_the_drain_after_the_last_session_start_is_left_out():
    """Sessions start at 0, 1, ..., 99 s, each issuing a turn a second for 50 s: after the last
    start the load only drains."""
    arrival, finish, session = [], [], []
    for s in range(100):
        for t in range(50):
            arrival.append(s + t)
            finish.append(s + t + 0.5)
            session.append(s)
    df = frame(np.array(arrival, float), np.array(finish, float), np.array(session))
    assert issue_end(df) == 99.0
    assert steady_window(df).end_s == 99.0


def test_mser_deletes_the_warm_up():
    batches = np.concatenate([np.linspace(0, 10, 10), 10 + np.sin(np.arange(40))])
    assert 8 <= mser(batches) <= 12
    two = frame(np.array([0.0, 1.0]), np.array([2.0, 3.0]))
    assert in_flight(two, np.array([0.5, 1.5, 2.5])).tolist() == [1, 2, 1]


def test_a_window_shorter_than_the_clock_resolves_has_no_rate():
    """Two requests a femtosecond apart measure no rate (it used to overflow to infinity)."""
    requests = pd.DataFrame({"arrival_s": [5.0, 5.0 + 1e-15], "slo_met": [True, True]})
    figures = window_figures(requests, 5.0, 5.0 + 1e-15)
    assert figures["steady_rps"] is None and figures["steady_rps_lo"] is None
