"""Capacity: the highest arrival rate at which a target share of requests meets the SLO.

The trace is time-scaled (arrival times divided by a factor), so the traffic's shape, sessions and
prefix structure stay; only its rate changes. The factor is bracketed by doubling or halving, then
bisected.
"""
from __future__ import annotations

from dataclasses import dataclass

from pddsim.config import Config
from pddsim.sim import Result, simulate
from pddsim.workload.model import Workload


@dataclass
class Capacity:
    capacity_rps: float
    time_scale: float
    result: Result          # the run at that rate

    def summary(self) -> dict:
        return {"capacity_rps": self.capacity_rps, **self.result.summary}


def _arrival_rate(workload: Workload, scale: float) -> float:
    times = [r.arrival_s for r in workload.requests]
    span = (max(times) - min(times)) / scale
    return len(times) / span if span > 0 else float("inf")


def find_capacity(cfg: Config, workload: Workload, *, seed: int | None = None, rel_tol: float = 0.03,
                  max_doublings: int = 8, on_progress=None) -> Capacity:
    """Bisect the time scale to `rel_tol`; `on_progress` is passed to every run's simulate."""
    target = cfg.slo.target

    def run(scale: float) -> Result:
        scaled = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"time_scale": scale})})
        return simulate(scaled, workload, seed, on_progress=on_progress)

    def meets(result: Result) -> bool:
        return result.summary["slo_attainment"] >= target

    scale = cfg.workload.time_scale
    first = run(scale)
    if meets(first):
        lo, lo_res, hi = scale, first, None
        for _ in range(max_doublings):
            res = run(lo * 2)
            if not meets(res):
                hi = lo * 2
                break
            lo, lo_res = lo * 2, res
        if hi is None:                       # never failed: report the highest rate tried
            return Capacity(_arrival_rate(workload, lo), lo, lo_res)
    else:
        hi, lo, lo_res = scale, None, None
        for _ in range(max_doublings):
            res = run(hi / 2)
            if meets(res):
                lo, lo_res = hi / 2, res
                break
            hi /= 2
        if lo is None:
            return Capacity(0.0, 0.0, res)
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        res = run(mid)
        if meets(res):
            lo, lo_res = mid, res
        else:
            hi = mid
    return Capacity(_arrival_rate(workload, lo), lo, lo_res)
