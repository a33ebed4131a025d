"""Plan: search the deployment space around a base config for the shape that serves best per dollar
(or most, or a load at the least cost), measuring each shape's capacity rather than guessing it.

The space is the product of `--vary PATH=A..B` or `PATH=V1,V2,...` axes over any dotted config path.
A point costs nothing to price, a lot to measure (a capacity search), so the search measures as few
as it can while staying exact:

* a point over the budget is never run;
* capacity does not fall when instances are added to a pool (the bottleneck pool gains capacity,
  any other pool leaves it unchanged), so a measured point bounds the capacity of every point with
  fewer instances and otherwise the same values (up to the capacity search's tolerance). A point
  whose bound is below `--load` cannot meet it; a point whose bound cannot beat the best so far on
  the objective, and which a measured point at no more cost already matches (dominated on cost and
  capacity), can neither win nor sit on the Pareto front; both are pruned unrun.

Each point's capacity search starts at a measured neighbour's capacity load (one instance apart,
from the waves before) instead of the configured rate; it tries the same lattice of loads
(`pddsim.experiments.capacity.Lattice`), so it finds what a search from scratch would where SLO
attainment is monotone in the load, in fewer runs.

Asked only for the winner (`winner_only`, as `compare --best-split` asks; the capacity objective,
one seed), a point's search is also given the capacity load of the best point measured so far and
ends at the first load at or below it that fails: such a point cannot win (the rate a deployment
sustains rises with the load offered), so it is "beaten" after one run (its search tries that load
first) instead of a whole search, and so are the points with no more instances, pruned unrun. Their
capacities and the Pareto front are then not measured; the winner's search is whole. So that the
best is known early, the first waves are cut to the two points nearest (fewest instances moved) the
best so far, or before one is known the configured split, for as long as each such wave finds a new
best; the rest of the wave then runs at once, given that best to beat.

Points run in waves, alternately the largest (maximal) and the smallest (minimal) of the points
still open: the largest give the bounds, the smallest the cheap points that dominate. A wave is
chosen from the measurements of the waves before it only, so which points run, and every number,
is the same whatever the backend or the number of workers. A wave that does not fill every worker
lends the idle ones to the points of the next wave: measured ahead, a point's result waits until
its wave comes, and is dropped unseen if the point is pruned first, so it only saves time.
Several plans (`best_splits`: one a system) run side by side, a wave of each in one batch, so one
plan's short wave does not leave workers idle while another has work; each is the plan it is alone.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import pandas as pd

from pddsim.config import Config, load_config
from pddsim.cost import cost_per_hour, gpu_price
from pddsim.errors import InputError
from pddsim.experiments.backends import Failed, Processes
from pddsim.experiments.capacity import BELOW_BEAT, Lattice, find_capacity, interval
from pddsim.experiments.result_cache import ResultCache, workload_digest
from pddsim.experiments.sweep import parse_axis, point_label
from pddsim.sim import load_workload
from pddsim.system.deployment import check_fits
from pddsim.workload.model import Workload

OBJECTIVES = ("bcr", "capacity", "cost", "margin")
TASK = "plan-capacity"      # what a cached result measured
CAPACITY_TOL = 0.03         # the capacity search's relative tolerance
SCOUTS = 2                  # points a winner-only plan measures at a time while its best moves
# the slack on bounds: a capacity is the rate at the last passing load of the search's lattice, the
# true one lies below the next load up
CAPACITY_SLACK = 2.0 ** (1 / Lattice(1.0, CAPACITY_TOL, False, None).steps)
RANGE = re.compile(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(\d+)\s*)?")


def parse_vary(texts: list[str]) -> dict[str, list]:
    """`PATH=A..B[:STEP]` (integers, both ends included) or `PATH=V1,V2,...` (as `--grid`)."""
    axes: dict[str, list] = {}
    for text in texts:
        key, _, spec = text.partition("=")
        m = RANGE.fullmatch(spec)
        if m and key.strip():
            lo, hi, step = int(m[1]), int(m[2]), int(m[3] or 1)
            values = list(range(lo, hi + 1, step)) if step > 0 else []
            if not values:
                raise InputError(f"--vary {text}: empty range")
            key = key.strip()
        else:
            key, values = parse_axis(text, "--vary")
        if key in axes:
            raise InputError(f"--vary {key}: given twice")
        axes[key] = values
    if not axes:
        raise InputError("plan: give at least one --vary PATH=RANGE|LIST")
    return axes


def measure(workloads: dict[str, Workload],
            task: tuple[Config, str, int, float | None, float | None]) -> dict:
    """One point at one seed (module level: workers call it by name), its search started at a
    neighbour's capacity load when one is known and ended early when it fails at or below the
    `beat` load: its capacity, the load there, BCR there and the pool that was busiest there (the
    bottleneck)."""
    cfg, workload_key, seed, start, beat = task
    cap = find_capacity(cfg, workloads[workload_key], seed=seed, rel_tol=CAPACITY_TOL, start=start,
                        beat=beat)
    if cap.status == BELOW_BEAT:
        return {"capacity_rps": None, "bcr_at_capacity": None, "margin_at_capacity": None,
                "bottleneck": None, "capacity_status": cap.status, "runs": cap.runs,
                "failed_load": cap.load}
    if cap.capacity_rps is None or cap.result is None:
        bound = float(cap.lower_bound_rps) if cap.status == "never saturated" else None
        return {"capacity_rps": None, "bcr_at_capacity": None, "margin_at_capacity": None,
                "bottleneck": None, "capacity_status": cap.status, "runs": cap.runs,
                "capacity_lower_bound_rps": bound}
    busy = cap.result.instances.assign(pool=cap.result.instances["instance"].str.rstrip("0123456789"))
    return {"capacity_rps": float(cap.capacity_rps), "capacity_load": cap.load, "runs": cap.runs,
            "bcr_at_capacity": float(cap.bcr or 0.0),
            "margin_at_capacity": float(cap.result.summary["margin_per_hour"]),
            "bottleneck": busy.groupby("pool")["busy_share"].mean().idxmax()}


# what is known of a point, by how the search left it (`Point.status`); a simulated point's
# outcome is "capacity", or when a seed's search found none, "lower bound only" (the SLO held at
# every load tried) or "never stationary" (no run settled into a steady state)
OUTCOMES = {"over budget": "over budget", "pruned": "pruned", "failed": "failed",
            "infeasible": "not a deployment", "open": "not run", "beaten": "beaten"}
LOWER_BOUND = "lower bound only"
NEVER_STATIONARY = "never stationary"


@dataclass
class Point:
    n: int                                  # 1-based position in the space
    values: dict[str, Any]
    cfg: Config | None
    cost: float | None
    status: str = "open"      # open, simulated, failed, over budget, infeasible, pruned, beaten
    reason: str = ""
    samples: list[Any] = field(default_factory=list)   # per seed: a measurement, or Failed
    capacity: float | None = None
    bcr: float | None = None
    margin: float | None = None

    def row(self) -> dict:
        cap = interval([s["capacity_rps"] for s in self.samples]) if self.samples else (None,) * 3
        bcr = interval([s["bcr_at_capacity"] for s in self.samples]) if self.samples else (None,) * 3
        margin = interval([s.get("margin_at_capacity") for s in self.samples]) if self.samples \
            else (None,) * 3
        bottleneck = self.samples[0]["bottleneck"] if self.samples else None
        outcome, reason, lower = OUTCOMES.get(self.status), self.reason, None
        if self.status == "simulated":
            missed = [x.get("capacity_status") for x in self.samples if x["capacity_rps"] is None]
            outcome = ("capacity" if not missed else
                       NEVER_STATIONARY if NEVER_STATIONARY in missed else LOWER_BOUND)
        if outcome == LOWER_BOUND:
            # a seed that found a capacity bounds it too; results cached without a bound give none
            reached = [s["capacity_rps"] if s["capacity_rps"] is not None
                       else s.get("capacity_lower_bound_rps") for s in self.samples]
            lower = min(reached) if None not in reached else None
            reason = ("the SLO held at every load tried" + (f", up to {lower:.3g} rps" if lower
                      else "") + ": the capacity is higher")
        elif outcome == NEVER_STATIONARY:
            reason = "no run of the capacity search settled into a steady state"
        return {"point": self.n, "values": self.values, "status": self.status, "outcome": outcome,
                "reason": reason, "capacity_lower_bound_rps": lower,
                "cost_per_hour": self.cost, "capacity_rps": cap[0], "capacity_lo": cap[1],
                "capacity_hi": cap[2], "bcr_at_capacity": bcr[0], "bcr_lo": bcr[1], "bcr_hi": bcr[2],
                "margin_at_capacity": margin[0], "margin_lo": margin[1], "margin_hi": margin[2],
                "bottleneck": bottleneck,
                "capacity_runs": sum(s.get("runs", 0) for s in self.samples) if self.samples else None}


@dataclass
class Plan:
    axes: dict[str, list]
    objective: str
    budget: float | None
    load: float | None
    seeds: list[int]
    points: list[dict]           # one row per point of the space, in space order
    ranked: list[int]            # point numbers of the points meeting the constraints, best first
    pareto: list[int]            # point numbers on the cost / capacity front, by cost
    simulated: int               # points measured (from the cache or run)
    cached: int                  # runs (point x seed) taken from the cache
    # simulations of searches measured ahead and then not used: how the work was spread over the
    # workers, not part of the plan (kept out of `to_json`, which is the same for any workers)
    unused_runs: int = 0

    @property
    def runs(self) -> int:
        """The simulations the plan's answer rests on: every capacity search's runs."""
        return sum(p["capacity_runs"] or 0 for p in self.points)

    def runs_text(self) -> str:
        """The simulations it took, where its CPU time went."""
        return f"{self.runs} simulations" + (
            f" (+{self.unused_runs} measured ahead, not used)" if self.unused_runs else "")

    @property
    def space(self) -> int:
        return len(self.points)

    def point(self, n: int) -> dict:
        return self.points[n - 1]

    @property
    def best(self) -> dict | None:
        return self.point(self.ranked[0]) if self.ranked else None

    @property
    def runner_up(self) -> dict | None:
        return self.point(self.ranked[1]) if len(self.ranked) > 1 else None

    @property
    def distinguishable(self) -> bool | None:
        """Whether the winner's and the runner-up's 95% intervals on the objective are apart
        (None: one seed, no intervals). Costs are exact: a cheaper winner is always apart."""
        a, b = self.best, self.runner_up
        if a is None or b is None:
            return None
        if self.objective == "cost" and a["cost_per_hour"] != b["cost_per_hour"]:
            return True
        key = self.objective if self.objective in ("bcr", "margin") else "capacity"
        if a[f"{key}_lo"] is None or b[f"{key}_lo"] is None:
            return None
        return a[f"{key}_lo"] > b[f"{key}_hi"] or b[f"{key}_lo"] > a[f"{key}_hi"]

    def frame(self) -> pd.DataFrame:
        """One row per point: the varied values as columns (non-scalar ones as JSON text)."""
        rows = []
        for p in self.points:
            values = {k: v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
                      for k, v in p["values"].items()}
            rank = self.ranked.index(p["point"]) + 1 if p["point"] in self.ranked else None
            rows.append({**values, **{k: v for k, v in p.items() if k != "values"}, "rank": rank,
                         "pareto": p["point"] in self.pareto})
        return pd.DataFrame(rows)

    def to_json(self) -> dict:
        return {"objective": self.objective, "budget": self.budget, "load": self.load,
                "seeds": self.seeds, "space": self.space, "simulated": self.simulated,
                "cached": self.cached, "runs": self.runs,
                "best": self.best, "runner_up": self.runner_up,
                "distinguishable": self.distinguishable,
                "pareto": [self.point(n) for n in self.pareto], "points": self.points}


def _leq(p: Point, q: Point, counts: list[str]) -> bool:
    """p has no more instances than q in any pool and the same everything else."""
    return all(p.values[k] <= q.values[k] if k in counts else p.values[k] == q.values[k]
               for k in p.values)


def _frontier(points: list[Point], counts: list[str], top: bool) -> list[Point]:
    if top:
        return [p for p in points if not any(q is not p and _leq(p, q, counts) for q in points)]
    return [p for p in points if not any(q is not p and _leq(q, p, counts) for q in points)]


def count_path(cluster: str, index: int) -> str:
    """The config path of an instance group's count, as `--vary` and `--set` address it."""
    return f"clusters.{cluster}.instances.{index}.count"


def split_of(cfg: Config) -> dict[str, int]:
    """`cfg`'s split: every instance group's count by its config path, in config order."""
    return {count_path(name, i): group.count for name, cluster in cfg.clusters.items()
            for i, group in enumerate(cluster.instances)}


def same_cost_moves(cfg: Config) -> list[tuple[str, str]]:
    """The moves of one instance between two of `cfg`'s instance groups that leave its cost as it
    is (both groups in one cluster, on the same GPU, as many an instance), as (from, to) count
    paths, in config order: same-DC PD's P <-> D, PDD's P <-> RLD (its MDs, in the other
    datacenter, have no partner: how much runs where is the deployment's choice, not its split's)."""
    groups = [(count_path(name, i), name, cluster.gpu, group.gpus)
              for name, cluster in cfg.clusters.items() for i, group in enumerate(cluster.instances)]
    return [(a, b) for a, *where_a in groups for b, *where_b in groups
            if a != b and where_a == where_b]


def neighbour_splits(cfg: Config) -> list[dict[str, int]]:
    """The splits one same-cost move away from `cfg`'s (`same_cost_moves`, in that order), every
    group keeping at least one instance."""
    split = split_of(cfg)
    return [{**split, a: split[a] - 1, b: split[b] + 1}
            for a, b in same_cost_moves(cfg) if split[a] > 1]


def split_axes(cfg: Config, budget: float) -> list[str]:
    """`--vary` texts over every instance group's count, from 1 to the most the budget buys with
    every other group at 1: the splits a system can have within the budget."""
    ones = cfg.model_copy(deep=True)
    for cluster in ones.clusters.values():
        for group in cluster.instances:
            group.count = 1
    floor = cost_per_hour(ones)
    vary = []
    for name, cluster in cfg.clusters.items():
        price = gpu_price(cfg, cluster.gpu)
        for i, group in enumerate(cluster.instances):
            most = 1 + int((budget - floor) // (group.gpus * price)) if budget >= floor else 1
            vary.append(f"{count_path(name, i)}=1..{most}")
    return vary


def best_splits(paths: Sequence[str | Path], overrides: Sequence[str] = (), *, budget: float | None = None,
                objective: str = "capacity", **search) -> list[tuple[Config, Plan]]:
    """Each system planned within one budget (default: the first system's cost as configured) on
    the first system's workload, for a fair comparison: each system's best split, with its plan.
    By default the best is the most capacity the budget buys: by BCR at capacity the smallest
    split that meets the SLO at some load wins (the cheapest way to serve a sliver of the
    traffic, not what the budget buys). Only each winner's capacity is measured whole
    (`winner_only`). The systems' plans run side by side, a wave of each in one batch of the
    backend's. `search`: as `plan` takes it (backend, cache, seed, progress)."""
    first = load_config(paths[0], overrides)
    budget = cost_per_hour(first) if budget is None else budget
    workload = first.workload.model_dump(mode="json", exclude_defaults=True)
    if first.workload.trace is not None:
        workload["trace"] = str(first.resolve(first.workload.trace))
    same_traffic = [*overrides, f"workload={json.dumps(workload)}"]
    backend = search.pop("backend", None)
    searches = [_setup(path, split_axes(load_config(path, same_traffic), budget), same_traffic,
                       budget=budget, objective=objective, winner_only=True, **search)
                for path in paths]
    _search_all(searches, backend)          # the systems' waves side by side: no idle worker
    chosen = []
    for path, planned in zip(paths, searches):
        result = planned.plan()
        if result.best is None:
            raise InputError(f"{path}: no split within ${budget:g}/h has a measured capacity")
        values = copy.deepcopy(result.best["values"])
        chosen.append((load_config(path, same_traffic, values), result))
    return chosen


class Known(NamedTuple):
    """A measured point with a capacity, its numbers unwrapped."""
    n: int
    cost: float
    capacity: float
    bcr: float
    margin: float | None      # None from results cached before margins were measured
    point: Point


class _Search:
    def __init__(self, points, axes, objective, budget, load, seeds, cache, on_progress,
                 winner_only=False, configured=None):
        self.points, self.axes, self.objective = points, axes, objective
        self.counts = [k for k in axes if k.endswith(".count")]
        self.winner_only = winner_only
        # the base config's counts on the count axes, where a winner-only search looks first
        self.configured = {k: v for k, v in (configured or {}).items() if k in self.counts}
        self.budget, self.load, self.seeds = budget, load, seeds
        self.cache = cache
        self.progress = on_progress or (lambda n: None)
        self.workloads: dict[str, tuple[Workload, str]] = {}     # key -> (workload, digest)
        self.cached = 0
        # (point, seed index) -> (its search's start, what it measured) for points measured ahead
        self.ahead: dict[tuple[int, int], tuple[float | None, Any]] = {}
        self.unused_runs = 0       # runs of searches measured ahead, then run again or pruned

    def _workload(self, cfg: Config) -> str:
        key = json.dumps([cfg.workload.model_dump(mode="json"), cfg.base_dir, cfg.seed])
        if key not in self.workloads:
            workload = load_workload(cfg)
            self.workloads[key] = (workload, workload_digest(workload) if self.cache else "")
        return key

    def measured(self) -> list[Point]:
        return [p for p in self.points if p.status == "simulated"]

    def known(self) -> list[Known]:
        """The measured points that have a capacity."""
        return [Known(p.n, p.cost, p.capacity, p.bcr, p.margin, p) for p in self.measured()
                if p.cost is not None and p.capacity is not None and p.bcr is not None]

    def rankable(self) -> list[Known]:
        return [k for k in self.known() if self.load is None or k.capacity >= self.load]

    def rank_key(self, k: Known) -> tuple[float, float, int]:
        if self.objective == "bcr":
            return (-k.bcr, k.cost, k.n)
        if self.objective == "margin":
            return (-(k.margin if k.margin is not None else -math.inf), k.cost, k.n)
        if self.objective == "capacity":
            return (-k.capacity, k.cost, k.n)
        return (k.cost, -k.capacity, k.n)

    def prepare(self, wave: list[Point]) -> _Batch:
        """The wave's runs: results measured ahead or cached are taken, the rest are tasks."""
        batch = _Batch(self, wave)
        for p in wave:
            p.samples = [None] * len(self.seeds)
            for i, task, key in self._tasks(p):
                where, hit = self.ahead.pop((p.n, i), (None, None))
                if where != task[3:]:       # measured ahead from another start or beat: run again
                    self._unused(hit)
                    hit = None
                if hit is None and key is not None:
                    hit = self.cache.get(key)
                    self.cached += hit is not None
                if hit is not None:
                    p.samples[i] = hit
                    self.progress(1)
                else:
                    batch.tasks.append(task)
                    batch.owners.append((p, i, key))
        batch.wanted = len(batch.tasks)
        return batch

    def lend(self, batch: _Batch, upcoming: list[Point], idle: int) -> int:
        """Up to `idle` runs of `upcoming` points measured ahead in `batch`; how many."""
        lent = 0
        for q, (i, task, key) in ((u, t) for u in upcoming for t in self._tasks(u)):
            if lent == idle:
                break
            if (q.n, i) not in self.ahead and not (key and self.cache.get(key)):
                batch.tasks.append(task)
                batch.owners.append((q, i, key))
                lent += 1
        return lent

    def done(self, batch: _Batch, j: int, value) -> None:
        if self.cache and not isinstance(value, Failed):
            self.cache.put(batch.owners[j][2], value)
        if j < batch.wanted:
            self.progress(1)

    def finish(self, batch: _Batch, values: list) -> None:
        """What the wave measured: each point simulated, beaten or failed."""
        for (p, i, _), value in zip(batch.owners[:batch.wanted], values):
            p.samples[i] = value
        for (p, i, _), task, value in zip(batch.owners[batch.wanted:], batch.tasks[batch.wanted:],
                                          values[batch.wanted:]):
            self.ahead[p.n, i] = (task[3:], value)
        for p in batch.wave:
            failure = next((s for s in p.samples if isinstance(s, Failed)), None)
            if failure is not None:
                p.status, p.reason, p.samples = "failed", failure.reason, []
                continue
            beaten = next((s for s in p.samples if s.get("capacity_status") == BELOW_BEAT), None)
            if beaten is not None:
                p.status = "beaten"
                p.reason = (f"the SLO failed at load {beaten['failed_load']:.6g}, at or below the "
                            "capacity load of the best point measured before it")
                continue
            p.status = "simulated"
            p.capacity = interval([s["capacity_rps"] for s in p.samples])[0]
            p.bcr = interval([s["bcr_at_capacity"] for s in p.samples])[0]
            p.margin = interval([s.get("margin_at_capacity") for s in p.samples])[0]

    def _unused(self, measured) -> None:
        if isinstance(measured, dict):
            self.unused_runs += measured.get("runs", 0)

    def _tasks(self, p: Point):
        """(seed index, task, cache key) for each of the point's seeds."""
        assert p.cfg is not None                      # open points are deployments
        for i, s in enumerate(self.seeds):
            cfg = p.cfg.model_copy(update={"seed": s})
            wkey = self._workload(cfg)
            start, beat = self.neighbour_load(p, i), self.beat_load(i)
            task = TASK + ("" if start is None else f" from {start!r}") + (
                "" if beat is None else f" beating {beat!r}")
            key = self.cache.key(task, cfg, self.workloads[wkey][1], s) if self.cache else None
            yield i, (cfg, wkey, s, start, beat), key

    def neighbour_load(self, p: Point, seed_index: int) -> float | None:
        """Where `p`'s search starts: the capacity load of a measured neighbour (one instance
        apart, the rest of the point alike; the first in the space), known from the waves
        before; None (the configured load) when no measured point is one. The search tries the
        same lattice of loads from there, so where SLO attainment is monotone in the load it
        finds the capacity a search from scratch would, without the doublings up to it."""
        near = [(q.n, q.samples[seed_index].get("capacity_load")) for q in self.measured()
                if q.samples[seed_index].get("capacity_load") is not None
                and sum(abs(int(p.values[c]) - int(q.values[c])) for c in self.counts) == 1
                and all(p.values[k] == q.values[k] for k in p.values if k not in self.counts)]
        return min(near)[1] if near else None

    def best(self) -> Point | None:
        ranked = self.rankable()
        return min(ranked, key=self.rank_key).point if ranked else None

    def beat_load(self, seed_index: int) -> float | None:
        """Asked only for the winner: the capacity load of the best point measured so far (the
        waves before), which a point's search must pass to win."""
        best = self.best() if self.winner_only else None
        return None if best is None else best.samples[seed_index].get("capacity_load")

    def nearest(self, wave: list[Point]) -> list[Point]:
        """`wave` nearest first (instances moved) to the best point so far, or, before one is
        known, to the configured split: where the winner most likely is."""
        best = self.best()
        ref = self.configured if best is None else {k: best.values[k] for k in self.counts}
        return sorted(wave, key=lambda p: (sum(abs(int(p.values[k]) - int(ref[k]))
                                               for k in self.counts if k in ref), p.n))

    def bound(self, q: Point) -> tuple[float, Known | None]:
        """The least measured capacity among points with at least q's instances, raised by one
        step of the search's lattice (`CAPACITY_SLACK`): a measured capacity is the rate at the
        last load that passed, the true one lies below the next load up."""
        best, by = math.inf, None
        for k in self.known():
            if k.capacity < best and _leq(q, k.point, self.counts):
                best, by = k.capacity, k
        return best * CAPACITY_SLACK, by

    def cannot_win(self, cost: float, bound: float) -> bool:
        ranked = self.rankable()
        if not ranked:
            return False
        best = min(ranked, key=self.rank_key)
        if self.objective == "bcr":      # goodput never exceeds the arrival rate
            return bound * 3600.0 / cost < best.bcr
        if self.objective == "margin":   # revenue per request has no bound known in advance
            return False
        if self.objective == "capacity":
            return bound < best.capacity
        return cost > best.cost

    def dominator(self, cost: float, bound: float) -> Known | None:
        for k in self.known():
            if k.cost <= cost and k.capacity >= bound and (k.cost < cost or k.capacity > bound):
                return k
        return None

    def prune(self, open_: list[Point]) -> None:
        beaten = [p for p in self.points if p.status == "beaten"]
        for q in open_:
            under = next((b for b in beaten if _leq(q, b, self.counts)), None)
            bound, by = self.bound(q)
            if under is not None:       # no more capacity than a point that cannot win
                q.status = "pruned"
                q.reason = f"at most the instances of beaten point {under.n}"
            elif by is None or q.cost is None:
                continue
            elif self.load is not None and bound < self.load:
                q.status = "pruned"
                q.reason = f"capacity at most {bound:.3g} rps (point {by.n}) < load"
            elif self.cannot_win(q.cost, bound) and (dom := self.dominator(q.cost, bound)):
                q.status = "pruned"
                q.reason = f"dominated by point {dom.n}"
            if q.status == "pruned":
                self.progress(len(self.seeds))

    def waves(self) -> Iterator[tuple[list[Point], list[Point]]]:
        """The waves, each (its points, the points of the next one, which idle workers may
        measure ahead), each chosen once the one before it has been measured."""
        open_ = [p for p in self.points if p.status == "open"]
        top, climbing = True, self.winner_only
        while open_:
            wave = _frontier(open_, self.counts, top)
            if climbing and len(wave) > SCOUTS:     # the points nearest the best, a few at a time
                near = self.nearest(wave)
                best = self.best()
                yield near[:SCOUTS], near[SCOUTS:]
                climbing = best is None or self.best() is not best
            else:
                rest = [p for p in open_ if p not in wave]
                yield wave, _frontier(rest, self.counts, not top)
                top = not top
            open_ = [p for p in open_ if p.status == "open"]
            self.prune(open_)
            open_ = [p for p in open_ if p.status == "open"]
        for _, measured in self.ahead.values():      # points pruned before their wave came
            self._unused(measured)

    def plan(self) -> Plan:
        """What the search found, once it has run."""
        ranked = [p.n for p in sorted(self.rankable(), key=self.rank_key)]
        return Plan(self.axes, self.objective, self.budget, self.load, self.seeds,
                    [p.row() for p in self.points], ranked, self.pareto(),
                    len(self.measured()) + sum(p.status in ("failed", "beaten") for p in self.points),
                    self.cached, self.unused_runs)

    def pareto(self) -> list[int]:
        front, best_cap = [], -math.inf
        for k in sorted(self.known(), key=lambda k: (k.cost, -k.capacity, k.n)):
            if k.capacity > best_cap:
                front.append(k.n)
                best_cap = k.capacity
        return front


@dataclass
class _Batch:
    """One wave's runs: `tasks[:wanted]` its own, the rest points of the next wave measured
    ahead; `owners[j]` is (point, seed index, cache key) of `tasks[j]`."""
    search: _Search
    wave: list[Point]
    tasks: list = field(default_factory=list)
    owners: list = field(default_factory=list)
    wanted: int = 0


def _search_together(searches: list[_Search], backend) -> None:
    """Run several plans' searches, a wave of each at a time in one batch of the backend's, so
    that one plan's short wave leaves no worker idle while another has work. Each plan's waves
    follow from its own measurements only: the plans are those run one by one."""
    steps = [s.waves() for s in searches]
    current = [next(g, None) for g in steps]
    workers = getattr(backend, "workers", 1)
    while any(step is not None for step in current):
        active = [(k, s.prepare(step[0]), step[1]) for k, (s, step) in enumerate(zip(searches, current))
                  if step is not None]
        wanted = sum(batch.wanted for _, batch, _ in active)
        idle = -wanted % workers if wanted else 0
        for _, batch, upcoming in active:
            idle -= batch.search.lend(batch, upcoming, idle)
        tasks = [t for _, batch, _ in active for t in batch.tasks]
        owner = [(batch, j) for _, batch, _ in active for j in range(len(batch.tasks))]
        shared = {t[1]: batch.search.workloads[t[1]][0] for _, batch, _ in active for t in batch.tasks}
        values = backend.map(measure, tasks, shared, partial(_done, owner))
        start = 0
        for k, batch, _ in active:
            batch.search.finish(batch, values[start:start + len(batch.tasks)])
            start += len(batch.tasks)
            current[k] = next(steps[k], None)


def _done(owner: list[tuple[_Batch, int]], j: int, value) -> None:
    """Task `j` of a merged batch is done: its plan caches it and counts it."""
    batch, k = owner[j]
    batch.search.done(batch, k, value)


def _search_all(searches: list[_Search], backend) -> None:
    """`_search_together` on `backend`, or on local processes started for it."""
    with Processes() if backend is None else nullcontext() as owned:
        _search_together(searches, owned or backend)


def build_points(base_path: str | Path, axes: dict[str, list], overrides: Sequence[str] = ()) -> list[Point]:
    """Every point of the space, configured and priced; a point whose model does not fit its GPUs
    is infeasible (recorded, not run); a path the schema does not know is bad input."""
    points = []
    for n, combo in enumerate(itertools.product(*axes.values()), 1):
        values = dict(zip(axes, combo))
        try:
            cfg = load_config(base_path, overrides, copy.deepcopy(values))
        except InputError as e:
            raise InputError(f"point {n} ({point_label(values)}): {e}") from None
        try:
            check_fits(cfg)
            points.append(Point(n, values, cfg, cost_per_hour(cfg)))
        except InputError as e:
            points.append(Point(n, values, None, None, "infeasible", str(e)))
    return points


def plan(base_path: str | Path, vary: list[str], overrides: Sequence[str] = (), *,
         budget: float | None = None, load: float | None = None, objective: str | None = None,
         seeds: int = 1, seed: int | None = None, backend=None, cache: ResultCache | None = None,
         on_progress: Callable[[int], None] | None = None,
         on_total: Callable[[int], None] | None = None, winner_only: bool = False) -> Plan:
    """Search the space; `backend` (default: local processes) runs the measurements, `cache`
    keeps and reuses them. `on_total(n)` is told the number of runs at most, `on_progress(k)` as
    runs finish or are pruned. `winner_only` (for the capacity objective with one seed; ignored
    otherwise): end the searches of points that cannot win early (module docstring)."""
    search = _setup(base_path, vary, overrides, budget=budget, load=load, objective=objective,
                    seeds=seeds, seed=seed, cache=cache, on_progress=on_progress,
                    on_total=on_total, winner_only=winner_only)
    _search_all([search], backend)
    return search.plan()


def _setup(base_path: str | Path, vary: list[str], overrides: Sequence[str], *,
           budget: float | None = None, load: float | None = None, objective: str | None = None,
           seeds: int = 1, seed: int | None = None, cache: ResultCache | None = None,
           on_progress: Callable[[int], None] | None = None,
           on_total: Callable[[int], None] | None = None, winner_only: bool = False) -> _Search:
    """The space checked, built and priced, ready to search (bad input raises here)."""
    objective = objective or ("cost" if load is not None else "bcr")
    if objective not in OBJECTIVES:
        raise InputError(f"--objective {objective}: expected one of {', '.join(OBJECTIVES)}")
    if objective == "cost" and load is None:
        raise InputError("--objective cost: needs --load (the least cost meeting what load?)")
    if seeds < 1:
        raise InputError(f"--seeds {seeds}: must be at least 1")
    if load is not None and load <= 0:
        raise InputError(f"--load {load:g}: must be positive")
    axes = parse_vary(vary)
    points = build_points(base_path, axes, overrides)
    costs = [p.cost for p in points if p.cost is not None]
    if not costs:
        raise InputError(f"plan: no point of the space is a deployment that fits: {points[0].reason}")
    if budget is not None:
        if budget < min(costs):
            raise InputError(f"--budget {budget:g}: below every point of the space "
                             f"(the cheapest costs ${min(costs):.2f}/h)")
        for p in points:
            if p.cost is not None and p.cost > budget:
                p.status, p.reason = "over budget", f"${p.cost:.2f}/h > ${budget:g}/h"
    base = load_config(base_path, overrides)
    base_seed = base.seed if seed is None else seed
    seed_list = [base_seed + i for i in range(seeds)]
    if on_total is not None:
        on_total(sum(p.status == "open" for p in points) * seeds)
    return _Search(points, axes, objective, budget, load, seed_list, cache, on_progress,
                   winner_only and objective == "capacity" and seeds == 1, split_of(base))


# ---- output -------------------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else spec.format(value)


def _with_interval(p: dict, key: str, spec: str) -> str:
    mean, lo = p[key], p[f"{key.split('_')[0]}_lo"]
    shown = _fmt(mean, spec)
    if lo is not None:
        shown += " ±" + spec.format((p[f"{key.split('_')[0]}_hi"] - lo) / 2)
    return shown


def format_plan(result: Plan, limit: int = 20) -> str:
    """The count line, the ranked table (then measured points that miss the load or failed), the
    winner against the runner-up, the Pareto front."""
    outcomes = pd.Series([p["outcome"] for p in result.points]).value_counts().to_dict()
    lines = [f"simulated {result.simulated} of {result.space} points ("
             + ", ".join(f"{n} {o}" for o, n in outcomes.items()) + "), "
             + result.runs_text()
             + (f"; {result.cached} run(s) from the cache" if result.cached else "")
             + f"; objective {result.objective}"
             + (f", budget ${result.budget:g}/h" if result.budget is not None else "")
             + (f", load {result.load:g} rps" if result.load is not None else "")
             + (f", {len(result.seeds)} seeds" if len(result.seeds) > 1 else "")]
    shown = result.ranked[:limit] + [p["point"] for p in result.points
                                     if p["point"] not in result.ranked
                                     and p["status"] in ("simulated", "failed")]
    rows = []
    for n in shown:
        p = result.point(n)
        rank = result.ranked.index(n) + 1 if n in result.ranked else "-"
        capacity = _with_interval(p, "capacity_rps", "{:.3f}")
        if p["outcome"] == LOWER_BOUND:
            capacity = ">= " + _fmt(p["capacity_lower_bound_rps"], "{:.3f}")
        rows.append({"rank": rank, "point": n, **{k: str(v) for k, v in p["values"].items()},
                     "outcome": p["outcome"], "cost $/h": _fmt(p["cost_per_hour"], "{:.1f}"),
                     "capacity rps": capacity,
                     "BCR at capacity": _with_interval(p, "bcr_at_capacity", "{:.2f}"),
                     "margin $/h": _with_interval(p, "margin_at_capacity", "{:.1f}"),
                     "bottleneck": p["bottleneck"] or "-",
                     "note": p["reason"] if p["outcome"] == "failed" else
                     ("below load" if result.load is not None and p["outcome"] == "capacity"
                      and n not in result.ranked else "")})
    if rows:
        lines += ["", pd.DataFrame(rows).to_string(index=False)]
    if outcomes.get(LOWER_BOUND):
        lines.append(f"{LOWER_BOUND}: the SLO held at every load the search tried (a fixed "
                     "workload ran out of sessions, or the search out of doublings): the capacity "
                     "is higher than shown, so such a point is not ranked")
    best = result.best
    if best is None:
        lines += ["", "no measured point meets the constraints"]
    else:
        lines += ["", f"best: point {best['point']} ({point_label(best['values'])}): "
                  f"capacity {_with_interval(best, 'capacity_rps', '{:.3f}')} rps, "
                  f"BCR {_with_interval(best, 'bcr_at_capacity', '{:.2f}')} req/$, "
                  f"${best['cost_per_hour']:.2f}/h"]
        if result.runner_up is not None:
            apart = {True: "distinguishable", False: "not distinguishable (95% intervals overlap)",
                     None: "distinguishable unknown (one seed: no intervals)"}[result.distinguishable]
            lines.append(f"runner-up: point {result.runner_up['point']}: {apart}")
    lines.append("Pareto front (cost $/h -> capacity rps): " + ", ".join(
        f"point {n} {result.point(n)['cost_per_hour']:.1f} -> {result.point(n)['capacity_rps']:.3f}"
        for n in result.pareto))
    return "\n".join(lines)


def main_counts(axes: dict[str, list]) -> list[str]:
    """The two count axes with the most values (the heatmap's), or the first two axes."""
    counts = [k for k in axes if k.endswith(".count")]
    pool = counts if len(counts) >= 2 else list(axes)
    return sorted(pool, key=lambda k: -len(axes[k]))[:2]


# what a heatmap cell without a BCR says, the most telling first when its points differ
CELL_OUTCOMES = (NEVER_STATIONARY, "failed", "pruned", "over budget", "not a deployment", "not run")


def heatmap_cells(points: list[dict], axes: dict[str, list]
                  ) -> tuple[str, str, np.ndarray, list[list[str]]]:
    """The heatmap over the two main axes: per cell the best BCR at capacity over any other axes
    (NaN where none was measured) and the cell's text, which where there is no BCR says what is
    known instead: a capacity lower bound, or why nothing was measured."""
    x, y = main_counts(axes)
    xs, ys = axes[x], axes[y]
    bcr = np.full((len(ys), len(xs)), np.nan)
    text = [[""] * len(xs) for _ in ys]
    cells: dict[tuple[int, int], list[dict]] = {}
    for p in points:
        cells.setdefault((ys.index(p["values"][y]), xs.index(p["values"][x])), []).append(p)
    for (i, j), mine in cells.items():
        values = [p["bcr_at_capacity"] for p in mine
                  if p["outcome"] == "capacity" and p["bcr_at_capacity"] is not None]
        bounds = [p["capacity_lower_bound_rps"] or 0.0 for p in mine if p["outcome"] == LOWER_BOUND]
        if values:
            bcr[i, j] = max(values)
            text[i][j] = f"{bcr[i, j]:.1f}"
        elif bounds:
            text[i][j] = f">= {max(bounds):.3g} rps"
        else:
            text[i][j] = min((p["outcome"] for p in mine), key=CELL_OUTCOMES.index)
    return x, y, bcr, text


def plot_heatmap(result: Plan, ax) -> None:
    """Best BCR at capacity at each value pair of the two main axes (over any other axes); a cell
    without one says what is known of it instead."""
    x, y, grid, text = heatmap_cells(result.points, result.axes)
    xs, ys = result.axes[x], result.axes[y]
    image = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    for i, row in enumerate(text):
        for j, label in enumerate(row):
            measured = not np.isnan(grid[i, j])
            ax.text(j, i, label, ha="center", va="center", fontsize=7 if measured else 6,
                    color="white" if measured else "0.3")
    if result.best is not None:
        ax.scatter([xs.index(result.best["values"][x])], [ys.index(result.best["values"][y])],
                   marker="s", s=300, facecolors="none", edgecolors="red", linewidths=2)
    ax.figure.colorbar(image, ax=ax, label="BCR at capacity, req/$")
    ax.set_title("BCR at capacity (a cell without one says why)")


def plot_pareto(result: Plan, ax) -> None:
    """Cost against capacity of every measured point; a point whose capacity was not found at its
    lower bound, marked as such (its capacity is higher)."""
    measured = [p for p in result.points if p["outcome"] == "capacity"]
    ax.scatter([p["cost_per_hour"] for p in measured], [p["capacity_rps"] for p in measured],
               color="0.6", label="measured")
    bounded = [p for p in result.points if p["outcome"] == LOWER_BOUND
               and p["capacity_lower_bound_rps"] is not None]
    if bounded:
        ax.scatter([p["cost_per_hour"] for p in bounded],
                   [p["capacity_lower_bound_rps"] for p in bounded], marker="^", color="C1",
                   label="capacity not found: at least")
    front = [result.point(n) for n in result.pareto]
    ax.plot([p["cost_per_hour"] for p in front], [p["capacity_rps"] for p in front], "o-",
            color="C0", label="Pareto front")
    if result.best is not None:
        ax.scatter([result.best["cost_per_hour"]], [result.best["capacity_rps"]], marker="*", s=250,
                   color="C3", zorder=3, label="best")
    if result.budget is not None:
        ax.axvline(result.budget, color="k", ls="--", lw=1, label="budget")
    if result.load is not None:
        ax.axhline(result.load, color="k", ls=":", lw=1, label="load")
    ax.set_xlabel("cost, $/h")
    ax.set_ylabel("capacity, req/s")
    ax.legend()


def prepare_out(out_dir: str | Path) -> Path:
    """The `--out` folder, created before the plan runs, so a bad path costs no runs."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out_dir}: cannot create ({e.strerror})") from None
    return out


def write_outputs(result: Plan, out_dir: str | Path) -> None:
    """points.parquet, pareto.png and (with two axes) heatmap.png."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = prepare_out(out_dir)
    result.frame().to_parquet(out / "points.parquet", index=False)
    fig = Figure(figsize=(6, 4.5))
    FigureCanvasAgg(fig)
    plot_pareto(result, fig.subplots())
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=120)
    if len(result.axes) >= 2:
        fig = Figure(figsize=(7, 5))
        FigureCanvasAgg(fig)
        plot_heatmap(result, fig.subplots())
        fig.tight_layout()
        fig.savefig(out / "heatmap.png", dpi=120)
