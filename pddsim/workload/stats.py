"""What a workload looks like before it is simulated: lengths, rate, and its prefix-hit skew.

PDD's premise is that the hit-rate distribution is skewed (most requests hit > 95%, a few hit
little) and that the mix moves over time; these statistics check a trace against that premise.
A request's hit rate here is the best any cache could do for it: the longest prefix left by all
earlier requests (or by an LRU cache of a given size), in whole blocks, over its input.
"""
from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from pddsim.engine.prefix_cache import PrefixCache
from pddsim.errors import InputError
from pddsim.workload.model import TraceTable, Workload

BUCKETS = ("[0,50)", "[50,70)", "[70,90)", "[90,95)", "[95,99)", "[99,100]")
"""Hit-rate buckets (percent), shared with the simulator's metrics."""
BUCKET_EDGES = (0.50, 0.70, 0.90, 0.95, 0.99)
"""Boundaries between consecutive buckets; a rate on a boundary belongs to the upper bucket."""
PERCENTILES = (50, 90, 99)
DEFAULT_WINDOWS = 10
BUCKET_COLORMAP, BUCKET_COLOR_RANGE = "RdYlGn", (0.05, 0.95)   # red: low hit, green: high hit
TIME_UNITS = ((86400.0, "days"), (3600.0, "hours"), (60.0, "minutes"), (1.0, "seconds"))
"""Plot time axes use the largest unit that the trace spans at least twice."""
"""Text table layout: row label, numeric cell, and per-cache column widths (characters)."""


def bucket_index(rates: np.ndarray) -> np.ndarray:
    """Bucket positions in BUCKETS of an array of hit rates."""
    return np.searchsorted(BUCKET_EDGES, rates, side="right")


def bucket_shares(rates: np.ndarray) -> dict[str, float]:
    """Share of requests per bucket (all labels present; zeros when there are no requests)."""
    counts = np.bincount(bucket_index(np.asarray(rates)), minlength=len(BUCKETS))
    total = max(int(counts.sum()), 1)
    return {label: int(c) / total for label, c in zip(BUCKETS, counts)}


def cached_tokens(workload: Workload, capacity_tokens: int | None = None) -> np.ndarray:
    """Tokens of each request's longest cached prefix, the cache seeing requests in arrival order."""
    cache = PrefixCache(capacity_tokens)
    result = np.zeros(len(workload), dtype=np.int64)
    for i, r in enumerate(workload.requests):
        result[i] = min(cache.match(r.hash_ids) * r.block_tokens, r.input_tokens)
        cache.insert(r.hash_ids, r.block_tokens)
    return result


def _hit_fields(ordered: Workload, inputs: np.ndarray, window_of: np.ndarray,
                window_starts: np.ndarray, capacity_tokens: int | None) -> dict:
    cached = cached_tokens(ordered, capacity_tokens)
    hits = np.minimum(cached / np.maximum(inputs, 1), 1.0)
    windows = [
        {"start_s": float(start), "requests": int(np.count_nonzero(window_of == w)),
         "bucket_shares": bucket_shares(hits[window_of == w])}
        for w, start in enumerate(window_starts)
    ]
    return {"hit_rate_mean": float(hits.mean()),
            "hit_rate_token_weighted": float(cached.sum() / max(int(inputs.sum()), 1)),
            "bucket_shares": bucket_shares(hits),
            "windows": windows}


def _distribution(values: np.ndarray) -> dict[str, float]:
    result = {f"p{q}": float(v) for q, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))}
    result["mean"] = float(values.mean())
    return result


def _windows(arrivals: np.ndarray, window_s: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(window index of each request, window start times); the default is a tenth of the span."""
    first, duration = arrivals[0], arrivals[-1] - arrivals[0]
    if window_s is not None and window_s <= 0:
        raise InputError(f"window_s={window_s} must be > 0")
    if duration == 0:
        return np.zeros(len(arrivals), dtype=np.int64), np.array([first])
    if window_s is None:
        n, window_s = DEFAULT_WINDOWS, duration / DEFAULT_WINDOWS
    else:
        n = max(math.ceil(duration / window_s), 1)
    index = np.minimum(((arrivals - first) // window_s).astype(np.int64), n - 1)
    return index, first + window_s * np.arange(n)


def trace_stats(workload: Workload, *, lru_capacity_tokens: int | None = None,
                window_s: float | None = None) -> dict:
    """Lengths, arrival rate and prefix-hit statistics of a workload (see the module docstring).

    Hit fields are under an unbounded cache; with `lru_capacity_tokens` they are repeated for an
    LRU cache of that size under key `lru`.
    """
    if not workload.requests:
        raise InputError(f"workload {workload.source!r} has no requests")
    if lru_capacity_tokens is not None and lru_capacity_tokens <= 0:
        raise InputError(f"lru_capacity_tokens={lru_capacity_tokens} must be > 0")
    arrivals = workload.requests.column("arrival_s")
    order = np.argsort(arrivals, kind="stable")
    ordered = Workload(TraceTable.of(workload.requests[i] for i in order.tolist()), workload.source)
    arrivals = arrivals[order]
    inputs = ordered.requests.column("input_tokens")
    outputs = ordered.requests.column("output_tokens")
    hit_fields = partial(_hit_fields, ordered, inputs, *_windows(arrivals, window_s))
    duration = float(arrivals[-1] - arrivals[0])
    stats = {"requests": len(ordered),
             "duration_s": duration,
             "arrival_rate_rps": len(ordered) / duration if duration > 0 else None,
             "input_tokens": _distribution(inputs),
             "output_tokens": _distribution(outputs),
             **hit_fields(None)}
    if lru_capacity_tokens is not None:
        stats["lru"] = {"capacity_tokens": lru_capacity_tokens, **hit_fields(lru_capacity_tokens)}
    unhashed = sum(1 for r in ordered.requests if not r.hash_ids)
    if unhashed:
        stats["note"] = (f"{unhashed} of {len(ordered)} requests carry no prefix hashes: "
                         "their hit rate is 0")
    return stats


def plot_bucket_shares(workload: Workload, path: str | Path, *, window_s: float | None = None,
                       lru_capacity_tokens: int | None = None, stats: dict | None = None) -> None:
    """Stacked area chart of the bucket shares per time window (LRU cache if a capacity is given).

    `stats`, if given, is `trace_stats` of the same workload and arguments, so that a caller
    printing them too does not replay the cache twice.
    """
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if stats is None:
        stats = trace_stats(workload, lru_capacity_tokens=lru_capacity_tokens, window_s=window_s)
    hit = stats["lru"] if lru_capacity_tokens is not None else stats
    windows = hit["windows"]
    scale, unit = _time_unit(stats["duration_s"])
    starts = np.array([w["start_s"] for w in windows]) - windows[0]["start_s"]
    width = starts[1] - starts[0] if len(starts) > 1 else 0.0
    x = (starts + width / 2) / scale
    shares = np.array([[w["bucket_shares"][b] for w in windows] for b in BUCKETS])

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = colormaps[BUCKET_COLORMAP](np.linspace(*BUCKET_COLOR_RANGE, len(BUCKETS)))
    ax.stackplot(x, shares, labels=[f"{b}%" for b in BUCKETS], colors=colors)
    ax.set_ylim(0, 1)
    ax.margins(x=0)
    ax.set_xlabel(f"time since first request ({unit}, window midpoints)")
    ax.set_ylabel("share of requests")
    cache = f"LRU cache of {lru_capacity_tokens:,} tokens" if lru_capacity_tokens else \
        "unbounded cache"
    ax.set_title(f"{Path(workload.source).name}: prefix hit-rate buckets ({cache})")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], title="hit rate", loc="center left",
              bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path)


def _time_unit(duration_s: float) -> tuple[float, str]:
    for scale, unit in TIME_UNITS:
        if duration_s >= 2 * scale:
            return scale, unit
    return TIME_UNITS[-1]


def format_stats(stats: dict) -> str:
    """Readable terminal summary of `trace_stats` output."""
    rate = stats["arrival_rate_rps"]
    totals = pd.Series({"requests": f"{stats['requests']:,}",
                        "duration s": f"{stats['duration_s']:,.1f}",
                        "arrivals/s": "n/a" if rate is None else f"{rate:.3f}"})
    tokens = pd.DataFrame({name.removesuffix("_tokens"): {k: f"{v:,.0f}" for k, v in stats[name].items()}
                           for name in ("input_tokens", "output_tokens")}).T

    caches = {"unbounded cache": stats}
    if "lru" in stats:
        caches[f"LRU {stats['lru']['capacity_tokens']:,} tokens"] = stats["lru"]
    rows = {"mean": "hit_rate_mean", "token-weighted": "hit_rate_token_weighted"}
    hit = pd.DataFrame({name: {**{label: f"{c[key]:.1%}" for label, key in rows.items()},
                               **{f"{b} %": f"{c['bucket_shares'][b]:.1%}" for b in BUCKETS}}
                        for name, c in caches.items()}).rename_axis("prefix hit")

    name, last = list(caches.items())[-1]
    windows = pd.DataFrame([{"window start s": f"{w['start_s']:,.0f}", "requests": f"{w['requests']:,}",
                             **{b: f"{w['bucket_shares'][b]:.1%}" for b in BUCKETS}}
                            for w in last["windows"]])
    parts = [totals.to_string(), tokens.to_string(), hit.to_string(),
             f"bucket shares per time window ({name})\n{windows.to_string(index=False)}"]
    if "note" in stats:
        parts.append(f"note: {stats['note']}")
    return "\n\n".join(parts)
