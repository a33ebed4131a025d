"""Capacity: the highest arrival rate a deployment achieves while a target share of requests meets
the SLO.

The rate is measured from each run (`achieved_rps`: requests issued over the issue span), never
read off the trace's schedule: in closed loop a slow system slows its agents down, so the schedule
can promise far more load than a run offers. The search moves one load knob and keeps the
workload's shape (sessions, prefix structure, think times):

* `workload.time_scale` (recorded or Poisson session starts): sessions start that many times as
  often; open loop also plays each session that much faster, closed loop keeps its think times;
* `workload.concurrent_sessions` (concurrent starts): the number of sessions kept in flight.

The knob is bracketed by doubling or halving, then bisected. A workload holds finitely many
sessions, so a closed-loop search can run out of load before the SLO breaks (every session already
in flight at once): then the capacity is not found, and the highest rate achieved is a lower bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pddsim.config import Config
from pddsim.sim import Result, simulate
from pddsim.workload.model import Workload


@dataclass
class Capacity:
    capacity_rps: float | None  # None: the SLO target held at every load tried
    knob: str                   # the load knob searched: "time_scale" or "concurrent_sessions"
    load: float                 # its value in `result`'s run
    result: Result              # the run at capacity (not found: the highest rate achieved)

    @property
    def found(self) -> bool:
        return self.capacity_rps is not None

    @property
    def lower_bound_rps(self) -> float:
        """A rate the deployment achieved within the SLO target: the capacity, or at most it."""
        return self.result.summary["achieved_rps"] or 0.0

    def summary(self) -> dict:
        head = {"capacity_rps": self.capacity_rps, "capacity_found": self.found,
                "capacity_knob": self.knob, "capacity_load": self.load}
        if not self.found:
            head["capacity_lower_bound_rps"] = self.lower_bound_rps
        return {**head, **self.result.summary}


def load_knob(cfg: Config) -> str:
    """The workload field that sets the load of `cfg`'s replay."""
    return "concurrent_sessions" if cfg.workload.session_start == "concurrent" else "time_scale"


def at_load(cfg: Config, load: float) -> Config:
    """`cfg` with its load knob set to `load`."""
    knob = load_knob(cfg)
    value = int(load) if knob == "concurrent_sessions" else float(load)
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={knob: value})})


def _session_count(workload: Workload) -> int:
    """Sessions as replay counts them: a request without a session is its own."""
    ids = [r.session_id for r in workload.requests]
    return len({s for s in ids if s >= 0}) + sum(s < 0 for s in ids)


def find_capacity(cfg: Config, workload: Workload, *, seed: int | None = None,
                  rel_tol: float = 0.03, max_doublings: int = 8,
                  on_progress: Callable[[int], None] | None = None) -> Capacity:
    """Search `cfg`'s load knob (starting from its configured value) for the highest achieved rate
    at which `slo.target` of the requests meet the SLO, to `rel_tol` of the knob (one session for
    a concurrency). `max_doublings` bounds the bracketing each way. `on_progress` is passed to
    every run's simulate. The returned Capacity's `result` is that run, so `at_load(cfg,
    cap.load)` reproduces it."""
    knob = load_knob(cfg)
    integer = knob == "concurrent_sessions"
    ceiling = _session_count(workload) if integer else float("inf")
    runs: dict[float, Result] = {}

    def meets(load: float) -> bool:
        if load not in runs:
            runs[load] = simulate(at_load(cfg, load), workload, seed, on_progress=on_progress)
        return runs[load].summary["slo_attainment"] >= cfg.slo.target

    start = getattr(cfg.workload, knob)
    lo, hi = (start, None) if meets(start) else (None, start)
    for _ in range(max_doublings):
        if hi is None:
            assert lo is not None                # one of the two bounds is always known
            up = min(lo * 2, ceiling)
            if up == lo:
                break
            lo, hi = (up, None) if meets(up) else (lo, up)
        elif lo is None:
            down = max(hi // 2, 1) if integer else hi / 2
            if down == hi:
                break
            lo, hi = (down, hi) if meets(down) else (None, down)
        else:
            break
    if lo is None:                          # missed even at the lowest load tried
        assert hi is not None
        return Capacity(0.0, knob, hi, runs[hi])
    if hi is not None:
        while hi - lo > max(rel_tol * lo, 1 if integer else 0):
            mid = (lo + hi) // 2 if integer else (lo + hi) / 2
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    # in closed loop the achieved rate need not grow with the knob: take the best passing run
    passing = [load for load in runs if meets(load)]
    best = max(passing, key=lambda load: runs[load].summary["achieved_rps"] or 0.0)
    cap = Capacity(None, knob, best, runs[best])
    if hi is not None:
        cap.capacity_rps = cap.lower_bound_rps
    return cap
