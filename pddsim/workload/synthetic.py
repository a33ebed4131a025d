"""Seeded synthetic workloads: Poisson single-shot traffic and multi-turn Agent sessions.

The Agent generator exists because real Agent traces are scarce and their hit-rate mix cannot be
varied; its knobs reproduce the skew PDD relies on (most turns re-send a long cached context and
hit > 95%, a few turns start a context or append a large tool output and hit little) and let that
mix drift over time. Same seed, same workload.
"""
from __future__ import annotations

import numpy as np

from pddsim.config import (
    AgentSpec,
    AgentSynthetic,
    BenchmarkSpec,
    BenchmarkSynthetic,
    PoissonSpec,
    Synthetic,
    parse_diurnal,
    parse_drift,
)
from pddsim.engine.chain import Chain
from pddsim.intmath import ceil_div
from pddsim.workload.model import Clients, FlatIds, TraceTable, Workload


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Lognormal samples with the given mean; `sigma` (of the log) sets the tail weight."""
    return rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, size)


def _tokens(samples: np.ndarray) -> np.ndarray:
    """Round to whole tokens, at least one."""
    return np.maximum(np.rint(samples), 1).astype(np.int64)


def _chains(blocks: np.ndarray, shared: int) -> FlatIds:
    """Each request's prefix-hash chain of `blocks[i]` ids: the `shared` ids 0 .. shared - 1
    every request has (at most its blocks), then ids no other request has, numbered on from
    those of the requests before it."""
    offsets = np.concatenate(([0], np.cumsum(blocks)))
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], blocks)   # of a block in its chain
    fresh = np.maximum(blocks - shared, 0)
    first_fresh = shared + np.cumsum(fresh) - fresh
    ids = np.where(position < shared, position,
                   np.repeat(first_fresh, blocks) + position - shared)
    return FlatIds(ids, offsets)


def poisson_workload(n_requests: int, rate_rps: float, input_mean: float, output_mean: float,
                     *, seed: int, **knobs: float) -> Workload:
    """`poisson(PoissonSpec(...), seed)` with the four knobs that have no default by position."""
    return poisson(PoissonSpec(n_requests=n_requests, rate_rps=rate_rps, input_mean=input_mean,
                               output_mean=output_mean, **knobs), seed)


def poisson(spec: PoissonSpec, seed: int) -> Workload:
    """Independent requests: Poisson arrivals, lognormal lengths (see `PoissonSpec`); the shared
    prefix isolates the cost of uncached prefill."""
    n = spec.n_requests
    prefix, bt = spec.shared_prefix_tokens, spec.block_tokens
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / spec.rate_rps, n))
    inputs = prefix + _tokens(_lognormal(rng, spec.input_mean - prefix, spec.input_sigma, n))
    outputs = _tokens(_lognormal(rng, spec.output_mean, spec.output_sigma, n))
    requests = TraceTable(arrivals, inputs, outputs, _chains(ceil_div(inputs, bt), prefix // bt),
                          bt)
    return Workload(requests, source=f"poisson(seed={seed})",
                    extra={"generator": "poisson", "seed": seed})


def day_time(flat_s: np.ndarray, curve: str, day_s: float) -> np.ndarray:
    """Points of a Poisson process of constant rate r (times `flat_s`) moved to where a process of
    rate r x m(t) puts them, m the day curve (time rescaling: t = W^-1(s), W(t) the integral of
    m from 0 to t; W is piecewise quadratic, inverted exactly on the curve's points and on a
    one-minute grid between them, linearly)."""
    grid_s, integral = _day_integral(curve, day_s)
    per_day = integral[-1]
    days = np.floor(flat_s / per_day)
    return days * day_s + np.interp(flat_s - days * per_day, integral, grid_s)


def curve_mean(curve: str) -> float:
    """The day curve's mean multiplier."""
    _, integral = _day_integral(curve, 24.0)
    return float(integral[-1] / 24.0)


def _day_integral(curve: str, day_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(t, W(t)) over one day on the curve's points and a one-minute grid: W the integral of the
    curve from midnight (exact there: the curve is linear between its points)."""
    hours, multipliers = parse_diurnal(curve)
    grid_h = np.union1d(np.linspace(0.0, 24.0, 24 * 60 + 1), hours)
    rate = np.interp(grid_h, hours, multipliers, period=24.0)
    grid_s = grid_h / 24.0 * day_s
    return grid_s, np.concatenate(([0.0], np.cumsum(np.diff(grid_s) * (rate[1:] + rate[:-1]) / 2)))


def agent_workload(spec: AgentSpec, seed: int, starts: np.ndarray | None = None) -> Workload:
    """Multi-turn Agent sessions; each turn follows the previous one and extends its hash chain.
    `starts`: the sessions' start times (default: `spec.sessions` Poisson starts at
    `spec.session_rate`, the first at 0), moved along the day curve when `spec.diurnal` is set.

    `arrival_s` is an open-loop estimate (session start + the earlier turns' think and estimated
    service times); closed-loop replay uses `follows` and `think_s` instead.
    """
    if starts is None:
        starts = np.cumsum(np.random.default_rng(seed).exponential(1 / spec.session_rate,
                                                                     spec.sessions))
        starts -= starts[0]
    if spec.diurnal:
        starts = day_time(starts, spec.diurnal, spec.day_s)
    n_sessions = len(starts)
    if not n_sessions:
        return Workload(TraceTable.of([]), source=f"agent(seed={seed})",
                        extra={"generator": "agent", "seed": seed})
    # each quantity from a stream of its own: the first k sessions are the same whatever the
    # number of sessions, so the workloads of two session rates share their sessions (common
    # random numbers for a capacity search)
    turns_rng, output_rng, context_rng, append_rng, long_rng, think_rng, reset_rng, flag_rng = (
        np.random.default_rng([seed, 11, k]) for k in range(8))
    turns = turns_rng.geometric(1 / spec.turns_mean, n_sessions)
    total = int(turns.sum())
    session = np.repeat(np.arange(n_sessions), turns)
    first = np.zeros(total, dtype=bool)
    first[np.cumsum(turns) - turns] = True

    outputs = _tokens(_lognormal(output_rng, spec.output_mean, spec.output_sigma, total))
    contexts = _tokens(_lognormal(context_rng, spec.context_mean, spec.context_sigma, total))
    appends = _tokens(_lognormal(append_rng, spec.append_mean, spec.append_sigma, total))
    longs = _tokens(_lognormal(long_rng, spec.long_mean, spec.append_sigma, total))
    think = np.where(first, 0.0, _lognormal(think_rng, spec.think_mean, spec.think_sigma, total))
    reset_draw, long_draw = reset_rng.random(total), flag_rng.random(total)

    # open-loop arrival: each turn waits for the previous turn's estimated service, then thinks
    service = spec.service_s + spec.tpot_s * outputs
    step = think + np.where(first, 0.0, np.roll(service, 1))
    elapsed = np.cumsum(step)
    arrivals = starts[session] + elapsed - elapsed[first][session]

    fractions, multipliers = parse_drift(spec.drift)
    span = arrivals.max()
    scale = np.interp(arrivals / span if span > 0 else arrivals, fractions, multipliers)
    reset = ~first & (reset_draw < spec.reset_prob * scale)
    long = long_draw < spec.long_prob * scale
    appended = np.where(long, longs, appends)

    system = Chain.run(0, spec.system_tokens // spec.block_tokens)
    next_id = len(system)
    bt = spec.block_tokens
    # built in session order, returned by arrival (stable: ties keep session order), `follows`
    # naming the previous turn by its place in that order
    order = np.argsort(arrivals, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(total)
    inputs: list[int] = []
    chains: list[Chain] = []
    prev_in, prev_out, prev_chain = 0, 0, system
    for is_first, is_reset, add, context, n_out in zip(
            first.tolist(), reset.tolist(), appended.tolist(), contexts.tolist(), outputs.tolist()):
        n_in = prev_in + prev_out + add
        fresh = is_first or is_reset or 0 < spec.max_context < n_in
        if fresh:                       # a new or rewritten context shares only the system prompt
            n_in = spec.system_tokens + context
        # the context so far, less a partial last block (it differs), then fresh ids; as runs of
        # ids, not a copy of the context per turn (engine/chain.py)
        shared, keep = (system, len(system)) if fresh else (prev_chain, prev_in // bt)
        chain = shared.extended(keep, next_id, ceil_div(n_in, bt) - keep)
        next_id += len(chain) - keep
        inputs.append(n_in)
        chains.append(chain)
        prev_in, prev_out, prev_chain = n_in, n_out, chain
    follows = np.where(first, -1, position[np.arange(total) - 1])
    requests = TraceTable(arrivals[order], np.asarray(inputs)[order], outputs[order],
                          [chains[k] for k in order.tolist()], bt, session[order], think[order],
                          follows[order])
    return Workload(requests, source=f"agent(seed={seed})", sessions=n_sessions,
                    extra={"generator": "agent", "seed": seed, "spec": spec.model_dump()})


def benchmark(spec: BenchmarkSpec, seed: int) -> Workload:
    """A fixed-concurrency serving benchmark (see `BenchmarkSpec`): warm-up then measured
    requests, each a prompt of its own (no block shared with another request)."""
    n = spec.warmup_requests + spec.measured
    rng = np.random.default_rng(seed)

    def lengths(mean: int, jitter: float) -> np.ndarray:
        if not jitter:
            return np.full(n, mean, dtype=np.int64)
        return _tokens(rng.normal(mean, jitter * mean, n))
    inputs, outputs = lengths(spec.isl, spec.isl_jitter), lengths(spec.osl, spec.osl_jitter)
    bt = spec.block_tokens
    requests = TraceTable(0.0, inputs, outputs, _chains(ceil_div(inputs, bt), 0), bt)
    return Workload(requests, source=f"benchmark(seed={seed})",
                    extra={"generator": "benchmark", "seed": seed, "spec": spec.model_dump()},
                    clients=Clients(spec.concurrency, spec.warmup_requests, spec.ramp_s, spec.think_s))


def generate(synthetic: Synthetic, seed: int) -> Workload:
    """The workload a config's `workload.synthetic` describes (its own session count)."""
    if isinstance(synthetic, AgentSynthetic):
        return agent_workload(synthetic.knobs, seed)
    if isinstance(synthetic, BenchmarkSynthetic):
        return benchmark(synthetic.knobs, seed)
    return poisson(synthetic.knobs, seed)

