"""Seeded synthetic workloads: Poisson single-shot traffic and multi-turn Agent sessions.

The Agent generator exists because real Agent traces are scarce and their hit-rate mix cannot be
varied; its knobs reproduce the skew PDD relies on (most turns re-send a long cached context and
hit > 95%, a few turns start a context or append a large tool output and hit little) and let that
mix drift over time. Same seed, same workload.
"""
from __future__ import annotations

import numbers
import operator
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import count, islice
from typing import Iterator

import numpy as np

from pddsim.errors import InputError
from pddsim.workload.model import TraceRequest, Workload

NO_DRIFT = ""


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Lognormal samples with the given mean; `sigma` (of the log) sets the tail weight."""
    return rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, size)


def _tokens(samples: np.ndarray) -> np.ndarray:
    """Round to whole tokens, at least one."""
    return np.maximum(np.rint(samples), 1).astype(np.int64)


def _blocks(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens)


def _chain(shared: tuple[int, ...], input_tokens: int, block_tokens: int,
           new_ids: Iterator[int]) -> tuple[int, ...]:
    """A request's prefix-hash chain: the shared prefix, then fresh ids for the other blocks."""
    return shared + tuple(islice(new_ids, _blocks(input_tokens, block_tokens) - len(shared)))


def poisson_workload(n_requests: int, rate_rps: float, input_mean: float, output_mean: float, *,
                     input_sigma: float = 1.0, output_sigma: float = 1.0,
                     shared_prefix_tokens: int = 0, block_tokens: int = 512, seed: int) -> Workload:
    """Independent requests: Poisson arrivals, lognormal lengths (the given means and sigmas).

    Every input starts with the same `shared_prefix_tokens` (a system prompt, cached across
    requests); the rest of each input is unique, so it isolates the cost of uncached prefill.
    """
    if n_requests < 1 or rate_rps <= 0 or output_mean <= 0 or block_tokens < 1:
        raise InputError("poisson workload: n_requests, rate_rps, output_mean and block_tokens "
                         "must be positive")
    if input_sigma < 0 or output_sigma < 0:
        raise InputError("poisson workload: input_sigma and output_sigma must be >= 0")
    if not 0 <= shared_prefix_tokens < input_mean:
        raise InputError(f"poisson workload: shared_prefix_tokens={shared_prefix_tokens} must be "
                         f"in [0, input_mean={input_mean})")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_rps, n_requests))
    inputs = shared_prefix_tokens + _tokens(
        _lognormal(rng, input_mean - shared_prefix_tokens, input_sigma, n_requests))
    outputs = _tokens(_lognormal(rng, output_mean, output_sigma, n_requests))
    shared = tuple(range(shared_prefix_tokens // block_tokens))
    new_ids = count(len(shared))
    requests = [
        TraceRequest(arrival_s=float(t), input_tokens=int(n_in), output_tokens=int(n_out),
                     hash_ids=_chain(shared, int(n_in), block_tokens, new_ids),
                     block_tokens=block_tokens)
        for t, n_in, n_out in zip(arrivals, inputs, outputs)
    ]
    return Workload(requests, source=f"poisson(seed={seed})",
                    extra={"generator": "poisson", "seed": seed})


def _knob(default, doc: str, **bounds: float):
    """A field of AgentSpec: `doc` is its help text, `bounds` (gt/ge/le) are checked on creation."""
    return field(default=default, metadata={"help": doc, **bounds})


_BOUND_CHECKS = {"gt": (operator.gt, ">"), "ge": (operator.ge, ">="), "le": (operator.le, "<=")}
_FIELD_TYPES = {"int": numbers.Integral, "float": numbers.Real, "str": str}


@dataclass(frozen=True)
class AgentSpec:
    """Knobs of the Agent workload; each field's help text is in its metadata (`help`).

    A session is one task: an LLM call per turn, each re-sending the whole context grown by the
    previous reply and the new tool output or user message. Lengths are lognormal (mean, sigma).
    The defaults give ~75% of requests at >= 95% prefix hit, a mean hit near 90% (PDD.md) and
    contexts of tens of thousands of tokens; for the paper scenario (~64K context, 1K output)
    raise `context_mean` (or `turns_mean`), bound it with `max_context` and set `output_mean`.
    """

    sessions: int = _knob(400, "number of sessions (tasks)", ge=1)
    session_rate: float = _knob(0.1, "sessions started per second (Poisson)", gt=0)
    turns_mean: float = _knob(30.0, "mean LLM calls per session (geometric, >= 1)", ge=1)
    system_tokens: int = _knob(4096, "system prompt and tool definitions, shared by all sessions",
                               ge=0)
    context_mean: float = _knob(24000.0, "mean task context sent with a session's first call "
                                        "(and after a reset)", gt=0)
    context_sigma: float = _knob(1.0, "lognormal sigma of the task context", ge=0)
    append_mean: float = _knob(500.0, "mean tool-output / user tokens appended per turn", gt=0)
    append_sigma: float = _knob(1.5, "lognormal sigma of appended tokens (heavy tail)", ge=0)
    long_prob: float = _knob(0.06, "probability per turn of a long tool output (file dump)",
                             ge=0, le=1)
    long_mean: float = _knob(60000.0, "mean tokens of a long tool output (sigma: append_sigma)",
                             gt=0)
    output_mean: float = _knob(400.0, "mean output tokens per call", gt=0)
    output_sigma: float = _knob(1.0, "lognormal sigma of output tokens", ge=0)
    think_mean: float = _knob(20.0, "mean seconds between a reply and the next call "
                                    "(tool run or user think time)", gt=0)
    think_sigma: float = _knob(1.5, "lognormal sigma of think time", ge=0)
    reset_prob: float = _knob(0.03, "probability per turn of a context reset or compaction: the "
                                     "call shares only the system prompt", ge=0, le=1)
    max_context: int = _knob(131072, "context tokens that trigger a compaction (0: never)", ge=0)
    service_s: float = _knob(3.0, "estimated seconds to first token, for open-loop arrivals",
                             ge=0)
    tpot_s: float = _knob(0.03, "estimated seconds per output token, for open-loop arrivals",
                          ge=0)
    block_tokens: int = _knob(64, "tokens per prefix-hash block", ge=1)
    drift: str = _knob(NO_DRIFT, "schedule 'f:m,f:m,...' scaling reset_prob and long_prob by m "
                                 "at fraction f of the trace's duration, linear in between "
                                 "(e.g. '0:0.5,1:2'); empty: none")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, _FIELD_TYPES[f.type]):
                raise InputError(f"agent spec: {f.name}={value!r} must be of type {f.type}")
            for key, (ok, sign) in _BOUND_CHECKS.items():
                if key in f.metadata and not ok(value, f.metadata[key]):
                    raise InputError(f"agent spec: {f.name}={value!r} must be {sign} "
                                     f"{f.metadata[key]}")
        parse_drift(self.drift)


def parse_drift(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Drift schedule 'f:m,...' -> (fractions, multipliers); empty text is a constant 1."""
    if not text.strip():
        return np.array([0.0]), np.array([1.0])
    try:
        points = [tuple(float(x) for x in item.split(":")) for item in text.split(",")]
        fractions, multipliers = (np.array(column) for column in zip(*points))
    except ValueError:
        raise InputError(f"agent spec: drift={text!r} is not 'fraction:multiplier,...'") from None
    if (fractions.ndim != 1 or np.any(np.diff(fractions) <= 0) or fractions[0] < 0
            or fractions[-1] > 1 or np.any(multipliers < 0)):
        raise InputError(f"agent spec: drift={text!r} needs increasing fractions in [0, 1] "
                         "and multipliers >= 0")
    return fractions, multipliers


def agent_workload(spec: AgentSpec, seed: int) -> Workload:
    """Multi-turn Agent sessions; each turn follows the previous one and extends its hash chain.

    `arrival_s` is an open-loop estimate (session start + the earlier turns' think and estimated
    service times); closed-loop replay uses `follows` and `think_s` instead.
    """
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1 / spec.session_rate, spec.sessions))
    starts -= starts[0]
    turns = rng.geometric(1 / spec.turns_mean, spec.sessions)
    total = int(turns.sum())
    session = np.repeat(np.arange(spec.sessions), turns)
    first = np.zeros(total, dtype=bool)
    first[np.cumsum(turns) - turns] = True

    outputs = _tokens(_lognormal(rng, spec.output_mean, spec.output_sigma, total))
    contexts = _tokens(_lognormal(rng, spec.context_mean, spec.context_sigma, total))
    appends = _tokens(_lognormal(rng, spec.append_mean, spec.append_sigma, total))
    longs = _tokens(_lognormal(rng, spec.long_mean, spec.append_sigma, total))
    think = np.where(first, 0.0, _lognormal(rng, spec.think_mean, spec.think_sigma, total))
    reset_draw, long_draw = rng.random(total), rng.random(total)

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

    system = tuple(range(spec.system_tokens // spec.block_tokens))
    new_ids = count(len(system))
    bt = spec.block_tokens
    requests: list[TraceRequest] = []
    prev_in, prev_out, prev_chain = 0, 0, ()
    for i in range(total):
        n_in = prev_in + prev_out + int(appended[i])
        fresh = first[i] or reset[i] or 0 < spec.max_context < n_in
        if fresh:                       # a new or rewritten context shares only the system prompt
            n_in = spec.system_tokens + int(contexts[i])
        shared = system if fresh else prev_chain[:prev_in // bt]   # a partial last block differs
        chain = _chain(shared, n_in, bt, new_ids)
        requests.append(TraceRequest(
            arrival_s=float(arrivals[i]), input_tokens=n_in, output_tokens=int(outputs[i]),
            hash_ids=chain, block_tokens=bt, session_id=int(session[i]),
            think_s=float(think[i]), follows=-1 if first[i] else i - 1))
        prev_in, prev_out, prev_chain = n_in, int(outputs[i]), chain

    return Workload(_sorted_by_arrival(requests, arrivals), source=f"agent(seed={seed})",
                    sessions=spec.sessions,
                    extra={"generator": "agent", "seed": seed, "spec": asdict(spec)})


def _sorted_by_arrival(requests: list[TraceRequest], arrivals: np.ndarray) -> list[TraceRequest]:
    """Sort by arrival (stable: ties keep session order) and remap `follows` to the new indexes."""
    order = np.argsort(arrivals, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    return [replace(requests[i], follows=int(position[requests[i].follows]))
            if requests[i].follows >= 0 else requests[i] for i in order]
