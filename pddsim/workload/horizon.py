"""Sessions started over a time horizon at a given rate: the offered load of a steady-state run.

A capacity measured on a fixed set of sessions runs out of sessions before it runs out of capacity
and mixes the ramps with the plateau; started as a Poisson process at rate r for long enough, the
load reaches a plateau whose level r sets. A recorded set of sessions is resampled: each start
draws one of its sessions, with replacement. A copy keeps the blocks its session shares with other
sessions (a system prompt) and gets fresh ids for its own, so two copies of one session do not hit
on each other's private context, which no two real sessions would.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pddsim.workload.model import TraceRequest, TraceTable, Workload

_CHUNK = 1024     # unit-rate gaps drawn at a time: a fixed size, so every rate sees the same points


def poisson_starts(rate: float, horizon_s: float, rng: np.random.Generator) -> np.ndarray:
    """The points of a Poisson process of `rate` on [0, horizon_s), coupled across rates: the
    points of one unit-rate process (`rng`'s exponential gaps, drawn in fixed chunks) divided by
    `rate`. A higher rate starts the same sessions sooner, and more of them (common random numbers):
    runs of a capacity search at two loads differ in load, not in draws, so a search's decisions
    do not depend on which loads it happened to try."""
    need = rate * horizon_s
    chunks, reached = [], 0.0
    while reached < need:
        chunk = reached + np.cumsum(rng.standard_exponential(_CHUNK))
        chunks.append(chunk)
        reached = float(chunk[-1])
    points = np.concatenate(chunks) if chunks else np.empty(0)
    return points[points < need] / rate


def sessions_of(workload: Workload) -> list[list[int]]:
    """Request indices per session, in order of first appearance; a request without a session is
    one of its own."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(workload.requests.session_id):
        groups.setdefault(s if s >= 0 else -1 - i, []).append(i)
    return list(groups.values())


def resample(base: Workload, rate: float, horizon_s: float, seed: int) -> Workload:
    """Sessions of `base` started as a Poisson process at `rate` per second over `horizon_s`,
    each drawn uniformly with replacement (seeded); a copy keeps its session's offsets, think
    times and dependency tree."""
    sessions = sessions_of(base)
    if not sessions:
        return replace(base, extra={**base.extra, "horizon_s": horizon_s, "rate": rate})
    starts = poisson_starts(rate, horizon_s, np.random.default_rng([seed, 7]))
    # the k-th start draws the same session at every rate (a stream of its own)
    picks = np.random.default_rng([seed, 8]).integers(0, len(sessions), len(starts))
    reqs = base.requests
    owners: dict[int, set[int]] = {}
    for s, members in enumerate(sessions):
        for i in members:
            for h in reqs[i].hash_ids:
                owners.setdefault(h, set()).add(s)
    private = [sorted({h for i in members for h in reqs[i].hash_ids if len(owners[h]) == 1})
               for members in sessions]
    next_id = max(owners, default=-1) + 1
    rows: list[tuple[float, int, TraceRequest]] = []     # (arrival, old index, request)
    origin: list[int] = []                               # per row: its copy
    for copy, (at, s) in enumerate(zip(starts.tolist(), picks.tolist())):
        members = sessions[s]
        fresh = {h: next_id + k for k, h in enumerate(private[s])}
        next_id += len(fresh)
        first = reqs[members[0]].arrival_s
        for i in members:
            r = reqs[i]
            rows.append((at + r.arrival_s - first, i, replace(
                r, arrival_s=at + r.arrival_s - first, session_id=copy,
                hash_ids=tuple(fresh.get(h, h) for h in r.hash_ids))))
            origin.append(copy)
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])
    position = {(origin[k], rows[k][1]): p for p, k in enumerate(order)}
    requests = [replace(rows[k][2], follows=-1 if rows[k][2].follows < 0
                        else position[(origin[k], rows[k][2].follows)]) for k in order]
    return Workload(TraceTable.of(requests), source=f"{base.source} resampled (rate={rate:g}/s, "
                    f"horizon={horizon_s:g} s, seed={seed})", sessions=len(starts),
                    extra={**base.extra, "horizon_s": horizon_s, "rate": rate})
