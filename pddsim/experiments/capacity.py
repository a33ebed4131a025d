"""Capacity: the highest load at which a deployment meets its SLO target, as the rate it sustains
there.

Offered load in steady state (`workload.horizon_s` set): the knob is the session start rate
(`workload.session_rate_rps`); sessions start as a Poisson process at it over the horizon (an Agent
generator's own sessions, or a recorded set resampled), so every load tried reaches a plateau. A
run is measured inside its steady-state window (`pddsim.stationary`: warm-up deleted by MSER-5,
the drain after the last start left out): it passes when `slo.target` of the requests issued there
meet the SLO; the capacity is the window's request rate at the highest passing load, with the 95%
interval of that rate by batch means. The window's trend test does not decide a pass: at light
loads, a few requests in flight, it flags chance drifts (the paper's PDD at 0.24 sessions/s, every
request within the SLO, was flagged), while an overloaded run fails on its SLO anyway as its queue
grows. The flag of the run at capacity is reported (`capacity_stationary`), and a search none of
whose runs became stationary reports that instead of a capacity.

A fixed set of sessions (no horizon) keeps the older measure: the knob is `workload.time_scale`
(or `workload.concurrent_sessions`) and a run is judged on its whole-run figures (`achieved_rps`,
`slo_attainment`), which include the ramps; such a search can run out of sessions before the SLO
breaks.

The rule. SLO attainment is not monotone in the load (a seed's draws can make a higher load pass
where a lower one failed), so the answer is stated as a rule, not as the best run seen: the knob is
bracketed by doubling or halving from its configured value (or from the doubling of it nearest a
given start, such as a neighbour's capacity in a plan), then the bracket is halved, keeping the
highest passing load `lo` below the lowest failing load `hi` tried; the capacity is the rate at
`lo`. Every load tried lies on one `Lattice` of the configured value, so where attainment is
monotone the answer does not depend on the start; the loads of a horizon workload share their
sessions (`pddsim.workload.horizon`), so two loads differ in load, not in draws. The halving stops
at adjacent points of the lattice (steps of at most `rel_tol`), or earlier when `hi - lo` is within
the rate interval's relative half-width at `lo` (a finer step than the rate can be measured to
buys nothing). A search whose highest load still passes never saturated: no capacity, the rate
there a lower bound.

A search can also stop once its answer no longer matters: given `beat` (a load, such as the
capacity load of the best point a plan has measured), it ends at the first load at or below `beat`
that fails, the capacity then lying below that load (status "below beat", no capacity). It tries
the lattice's load at `beat` first: a caller that wants only a deployment with more capacity than
`beat`'s learns that one is not in one run instead of a whole search, and a search that passes
there goes on as it would have, one run more.

Early stop. A run is stopped as soon as it can no longer pass: when the requests known to miss the
SLO already exceed what the target allows of all the workload's requests (whole run), or of the
requests always inside the stationary window, whatever warm-up MSER deletes (steady state). Only
failing runs stop, and a stopped run is judged failing, so the decisions, hence the capacity, are
those of the search without early stop; it saves the tail of every overloaded run.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pddsim.config import AgentSynthetic, Config
from pddsim.engine.request import Request
from pddsim.metrics import met_slo
from pddsim.sim import Result, load_workload, simulate
from pddsim.stationary import always_inside_from, window_figures
from pddsim.workload.horizon import sessions_of
from pddsim.workload.model import Workload

# two-sided 95% Student-t quantiles by degrees of freedom (beyond 30: the 30 value, conservative)
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]


BELOW_BEAT = "below beat"    # the status of a search that failed at or below its `beat` load


class _Beaten(Exception):
    """A search given `beat` failed at a load at or below it."""

    def __init__(self, load: float):
        super().__init__(load)
        self.load = load


@dataclass
class Capacity:
    capacity_rps: float | None  # None: not found (see `status`)
    knob: str                   # the load knob searched
    load: float                 # its value in `result`'s run
    result: Result              # the run at capacity (not found: the highest passing load's, or
                                # the last run tried when none passed)
    status: str = "found"       # found | failed at every load | never saturated | never stationary
                                # | below beat
    rate_rps: float = 0.0       # the rate measured in `result`'s run (the search's measure)
    slo_share: float = 0.0      # and its share of requests meeting the SLO
    interval: tuple[float, float] | None = None     # 95% of capacity_rps (batch means)
    runs: int = 0               # simulations the search ran
    stopped_early: int = 0      # of which stopped early
    wall_s: float = 0.0
    loads: dict[float, bool] = field(default_factory=dict)   # every load tried: passed?

    @property
    def found(self) -> bool:
        return self.capacity_rps is not None

    @property
    def lower_bound_rps(self) -> float:
        """A rate the deployment sustained within the SLO target: the capacity, or at most it."""
        return self.rate_rps

    @property
    def goodput_rps(self) -> float | None:
        """Requests meeting the SLO per second at capacity: the capacity times the SLO share on
        the same measure (steady state: the window's), or the whole run's goodput."""
        if not self.found:
            return None
        if self.knob != "session_rate_rps":
            return self.result.summary["goodput_rps"]
        return (self.capacity_rps or 0.0) * self.slo_share

    @property
    def bcr(self) -> float | None:
        """Goodput per dollar at capacity (requests per $)."""
        goodput = self.goodput_rps
        return None if goodput is None else goodput * 3600.0 / self.result.summary["cost_per_hour"]

    def summary(self) -> dict:
        head = {"capacity_rps": self.capacity_rps, "capacity_found": self.found,
                "capacity_status": self.status, "capacity_knob": self.knob,
                "capacity_load": self.load, "capacity_stationary":
                self.result.summary["steady_stationary"] if self.knob == "session_rate_rps" else None,
                "capacity_lo_rps": self.interval[0] if self.interval else None,
                "capacity_hi_rps": self.interval[1] if self.interval else None,
                "capacity_runs": self.runs, "capacity_runs_stopped_early": self.stopped_early,
                "goodput_at_capacity_rps": self.goodput_rps, "bcr_at_capacity": self.bcr}
        if self.status == "never saturated":
            head["capacity_lower_bound_rps"] = self.lower_bound_rps
        return {**head, **self.result.summary}


def load_knob(cfg: Config) -> str:
    """The workload field that sets the load of `cfg`'s replay."""
    if cfg.workload.horizon_s is not None:
        return "session_rate_rps"
    return "concurrent_sessions" if cfg.workload.session_start == "concurrent" else "time_scale"


def measure(result: Result, knob: str) -> dict:
    """What a search on `knob` reads of a run: its rate (`steady_rps`, with its interval) and SLO
    share in the steady-state window, stationary or not, or its whole-run figures."""
    s = result.summary
    if knob != "session_rate_rps":
        return {"steady_rps": s["achieved_rps"] or 0.0, "steady_rps_lo": None,
                "steady_rps_hi": None, "steady_slo_attainment": s["slo_attainment"]}
    return window_figures(result.requests, s["steady_window_start_s"], s["steady_window_end_s"])


def at_load(cfg: Config, load: float) -> Config:
    """`cfg` with its load knob set to `load`."""
    knob = load_knob(cfg)
    value = int(load) if knob == "concurrent_sessions" else float(load)
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={knob: value})})


def _session_count(workload: Workload) -> int:
    """Sessions as replay counts them: a request without a session is its own."""
    ids = workload.requests.column("session_id")
    return len(np.unique(ids[ids >= 0])) + int(np.count_nonzero(ids < 0))


def passes(result: Result, figures: dict, target: float) -> bool:
    """Whether a run met the SLO target on the search's measure (a stopped run did not)."""
    slo = figures["steady_slo_attainment"]
    return not result.summary["stopped_early"] and slo is not None and slo >= target


def hopeless(cfg: Config, workload: Workload, steady: bool) -> Callable[[Request], bool]:
    """The early-stop test of one run: True once the requests known to miss the SLO are more than
    `1 - slo.target` of every request the measure could count (all the workload's requests, an
    upper bound on those inside the window). Steady state counts only misses among requests
    issued where the window always reaches (`always_inside_from` the first issue to the last
    session start), so the misses counted are all inside it."""
    allowed = (1 - cfg.slo.target) * len(workload.requests)
    reqs = workload.requests
    start, end = -math.inf, math.inf
    firsts = [reqs.arrival_s[members[0]] for members in sessions_of(workload)] if steady else []
    if firsts:
        start, end = always_inside_from(min(firsts), max(firsts)), max(firsts)
    missed = 0

    def stop(req: Request) -> bool:
        nonlocal missed
        if start <= req.arrival_s <= end and not met_slo(req, cfg.slo):
            missed += 1
        return missed > allowed
    return stop


@dataclass(frozen=True)
class Lattice:
    """The loads a search may try, by position: the configured value times 2^(k / K), K a power
    of two of steps of at most `rel_tol` to a doubling (a concurrency: every whole number, its
    doublings the configured one times 2^j). A search brackets on the doublings, then halves
    the bracket; started at another doubling, it meets the same bracket and halves it the same
    way, so where SLO attainment is monotone in the load the capacity does not depend on the
    start (a plan starts each point at a neighbour's capacity)."""
    base: float
    rel_tol: float
    integer: bool
    ceiling: int | None         # a concurrency's most sessions

    @property
    def steps(self) -> int:
        """K: positions per doubling."""
        if self.integer:
            return 1
        return 2 ** math.ceil(math.log2(math.log(2) / math.log1p(self.rel_tol)))

    def load(self, k: int) -> float:
        return float(k) if self.integer else self.base * 2.0 ** (k / self.steps)

    def doubling(self, j: int) -> int:
        """The position of the configured value times 2^j."""
        if not self.integer:
            return j * self.steps
        b = int(self.base)
        k = b << j if j >= 0 else max(b >> -j, 1)
        return min(k, self.ceiling) if self.ceiling else k

    def nearest_doubling(self, load: float) -> int:
        """j of the doubling nearest `load`."""
        return round(math.log2(load / self.base))

    def at_or_below(self, load: float) -> int:
        """The position of the highest load of the lattice at or below `load` (`load` itself
        when it is one: a beat load is a capacity load of the same lattice)."""
        if self.integer:
            return max(int(load), 1)
        k = math.floor(math.log2(load / self.base) * self.steps + 1e-9)
        return k if self.load(k) <= load else k - 1


def find_capacity(cfg: Config, workload: Workload, *, seed: int | None = None,
                  rel_tol: float = 0.03, max_doublings: int = 8, early_stop: bool = True,
                  start: float | None = None, beat: float | None = None,
                  on_progress: Callable[[int], None] | None = None) -> Capacity:
    """Search `cfg`'s load knob for the highest load at which `slo.target` holds, by the rule in
    the module docstring, to `rel_tol` of the knob (one session for a concurrency). `workload` is
    the workload at the configured load (with a horizon, the search builds each load's own from the
    config). `start`: begin at the configured value's doubling nearest this load (a neighbour's
    capacity load, in a plan; default the configured value itself): the loads tried lie on the
    configured value's `Lattice` whatever the start. `max_doublings` bounds the bracketing each
    way. `beat`: end at the first load at or below it that fails (status "below beat"); the
    lattice's load at or below `beat` is tried first, so a search that cannot win ends in one run
    (a failing run, stopped early) and one that can costs one run more.
    `early_stop`: stop runs that can no longer pass (same capacity, less time). `on_progress` is
    passed to every run's simulate. The Capacity's `result` is the run at `load`, so
    `at_load(cfg, cap.load)` reproduces it."""
    wall0 = time.perf_counter()
    knob = load_knob(cfg)
    steady = knob == "session_rate_rps"
    integer = knob == "concurrent_sessions"
    base = getattr(cfg.workload, knob)
    ceiling = _session_count(workload) if integer else None
    lattice = Lattice(base, rel_tol, integer, ceiling)
    source = resample_source(cfg) if steady else None
    runs: dict[float, Result] = {}
    figures: dict[float, dict] = {}
    passed: dict[float, bool] = {}

    def meets(k: int) -> bool:
        load = lattice.load(k)
        if load not in runs:
            at = at_load(cfg, load)
            w = load_workload(at, source) if steady else workload
            stop = hopeless(at, w, steady) if early_stop else None
            runs[load] = simulate(at, w, seed, on_progress=on_progress, stop_when=stop)
            figures[load] = measure(runs[load], knob)
            passed[load] = passes(runs[load], figures[load], cfg.slo.target)
            if beat is not None and load <= beat and not passed[load]:
                raise _Beaten(load)
        return passed[load]

    def step_small_enough(lo: int, hi: int) -> bool:
        if hi - lo <= 1:
            return True
        f = figures[lattice.load(lo)]
        if integer or f["steady_rps_hi"] is None or not f["steady_rps"]:
            return False
        half = (f["steady_rps_hi"] - f["steady_rps_lo"]) / 2 / f["steady_rps"]
        return lattice.load(hi) - lattice.load(lo) <= half * lattice.load(lo)

    try:
        if beat is not None:    # tried first: a failure there ends the search in one run
            meets(lattice.at_or_below(beat))
        j = 0 if start is None else lattice.nearest_doubling(start)
        first = lattice.doubling(j)
        lo, hi = (first, None) if meets(first) else (None, first)
        for _ in range(max_doublings):
            if hi is None:
                assert lo is not None                # one of the two bounds is always known
                up = lattice.doubling(j + 1)
                if up == lo:
                    break
                j += 1
                lo, hi = (up, None) if meets(up) else (lo, up)
            elif lo is None:
                down = lattice.doubling(j - 1)
                if down == hi:
                    break
                j -= 1
                lo, hi = (down, hi) if meets(down) else (None, down)
            else:
                break
        if lo is not None and hi is not None:
            while not step_small_enough(lo, hi):
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    except _Beaten as beaten:
        last = runs[beaten.load]
        return Capacity(None, knob, beaten.load, last, BELOW_BEAT, runs=len(runs), loads=passed,
                        stopped_early=sum(bool(r.summary["stopped_early"]) for r in runs.values()),
                        wall_s=time.perf_counter() - wall0)
    at_k = lo if lo is not None else hi
    assert at_k is not None                     # one of the two bounds is always known
    at = lattice.load(at_k)
    f = figures[at]
    cap = Capacity(None, knob, at, runs[at], runs=len(runs), loads=passed,
                   rate_rps=f["steady_rps"] or 0.0, slo_share=f["steady_slo_attainment"] or 0.0,
                   stopped_early=sum(bool(r.summary["stopped_early"]) for r in runs.values()))
    if lo is None:                              # failed even at the lowest load tried
        if steady and not any(r.summary["steady_stationary"] for r in runs.values()):
            cap.status = "never stationary"
        else:
            cap.capacity_rps, cap.status = 0.0, "failed at every load"
    elif hi is None:
        cap.status = "never saturated"
    else:
        cap.capacity_rps = cap.rate_rps
        if f["steady_rps_lo"] is not None:
            cap.interval = (f["steady_rps_lo"], f["steady_rps_hi"])
    cap.wall_s = time.perf_counter() - wall0
    return cap


def resample_source(cfg: Config) -> Workload | None:
    """What a horizon workload of `cfg` resamples, read once for a search over rates (None: an
    Agent generator makes its sessions itself)."""
    if isinstance(cfg.workload.synthetic, AgentSynthetic):
        return None
    return load_workload(cfg.model_copy(update={"workload": cfg.workload.model_copy(
        update={"horizon_s": None})}))


def interval(samples: list[float | None]) -> tuple[float | None, float | None, float | None]:
    """Mean and 95% Student-t interval; no interval from one sample, no mean if one is missing."""
    values = [s for s in samples if s is not None]
    if len(values) < len(samples):
        return None, None, None
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, None, None
    t = T975[min(len(samples) - 1, len(T975)) - 1]
    half = t * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def distinguishable(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two capacities' 95% intervals are disjoint (None: an interval is missing)."""
    if a is None or b is None:
        return None
    return a[1] < b[0] or b[1] < a[0]
